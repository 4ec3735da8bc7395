package cluster

import (
	"errors"
	"net"
	"testing"
)

func TestDefaultAdvertiseIP(t *testing.T) {
	ipnet := func(s string) net.Addr {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		n.IP = ip
		return n
	}
	none := func() (string, error) { return "", errors.New("no private IP address found") }
	cases := []struct {
		name    string
		private func() (string, error)
		addrs   []net.Addr
		want    string
	}{
		{"a private IP wins", func() (string, error) { return "10.1.2.3", nil }, []net.Addr{ipnet("203.0.113.7/24")}, "10.1.2.3"},
		{"else the first public IPv4", none, []net.Addr{ipnet("127.0.0.1/8"), ipnet("fe80::1/64"), ipnet("2001:db8::7/64"), ipnet("203.0.113.7/24")}, "203.0.113.7"},
		{"else IPv6", none, []net.Addr{ipnet("127.0.0.1/8"), ipnet("2001:db8::7/64")}, "2001:db8::7"},
		{"else loopback: run alone", none, []net.Addr{ipnet("127.0.0.1/8"), ipnet("::1/128")}, "127.0.0.1"},
	}
	for _, c := range cases {
		got := defaultAdvertiseIP(c.private, func() ([]net.Addr, error) { return c.addrs, nil })
		if got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
