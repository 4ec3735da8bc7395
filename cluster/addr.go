package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
)

// withHost returns addr with its host replaced by ip when the host is empty
// or unspecified (":8082", "0.0.0.0:8082"), so that other nodes can dial it.
// Other addresses, and addresses that do not parse, are returned unchanged.
func withHost(addr, ip string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || ip == "" {
		return addr
	}
	if host != "" {
		if a := net.ParseIP(host); a == nil || !a.IsUnspecified() {
			return addr
		}
	}
	return net.JoinHostPort(ip, port)
}

// splitHostPort splits a host:port with a numeric port.
func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %w", p, err)
	}
	return host, int(port), nil
}

// splitAdvertise splits a host or host:port; port is 0 when absent.
func splitAdvertise(addr string) (string, int, error) {
	if ip := net.ParseIP(addr); ip != nil { // a bare IPv6 address has colons
		return addr, 0, nil
	}
	host, port, err := splitHostPort(addr)
	if err != nil {
		var aerr *net.AddrError
		if errors.As(err, &aerr) && aerr.Err == "missing port in address" {
			return addr, 0, nil
		}
		return "", 0, err
	}
	if host == "" {
		return "", 0, fmt.Errorf("%q: empty host", addr)
	}
	return host, port, nil
}

// resolveIP returns host as an IP, looking it up if it is a name. It prefers
// IPv4, as memberlist does when it picks an address itself.
func resolveIP(ctx context.Context, host string) (net.IP, error) {
	if ip := net.ParseIP(host); ip != nil {
		return ip, nil
	}
	ips, err := net.DefaultResolver.LookupIP(ctx, "ip", host)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", host, err)
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("resolve %s: no addresses", host)
	}
	for _, ip := range ips {
		if ip.To4() != nil {
			return ip, nil
		}
	}
	return ips[0], nil
}

// defaultAdvertiseIP picks the address to advertise when none is configured
// and the node binds all interfaces: memberlist's choice, a private IP, when
// there is one; else the first non-loopback IP of an interface that is up
// (a host with only public addresses), IPv4 first; else 127.0.0.1, so that a
// node on a machine with no network still runs alone. memberlist itself
// would refuse to start without a private IP.
func defaultAdvertiseIP(privateIP func() (string, error), addrs func() ([]net.Addr, error)) string {
	if ip, err := privateIP(); err == nil && ip != "" {
		return ip
	}
	as, _ := addrs()
	var v6 string
	for _, a := range as {
		n, ok := a.(*net.IPNet)
		if !ok || n.IP.IsLoopback() || n.IP.IsLinkLocalUnicast() || n.IP.IsUnspecified() {
			continue
		}
		if n.IP.To4() != nil {
			return n.IP.String()
		}
		if v6 == "" {
			v6 = n.IP.String()
		}
	}
	if v6 != "" {
		return v6
	}
	return "127.0.0.1"
}

// upInterfaceAddrs returns the addresses of the interfaces that are up.
func upInterfaceAddrs() ([]net.Addr, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []net.Addr
	for _, i := range ifaces {
		if i.Flags&net.FlagUp == 0 {
			continue
		}
		as, err := i.Addrs()
		if err != nil {
			continue
		}
		out = append(out, as...)
	}
	return out, nil
}
