// Package clients names the client a request comes from, and bounds what
// one client may hold of a node's shared tables (Quota), so that no
// single client exhausts a table every other client needs.
//
// A client is the name its verified TLS certificate bears, where it
// presented one (a CA given to --tls-client-ca verified it), else its
// source address range: a /24 of IPv4, a /64 of IPv6, since one host, or
// one customer's network, holds many addresses of its range (a /64 is
// what one IPv6 host is given). Nothing a client sends names it: a
// header such as X-Forwarded-For is not read, so an identity is forged
// only by holding a certificate of the CA, or addresses of another range.
package clients

import (
	"context"
	"crypto/tls"
	"net"
	"net/netip"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// ID names a client: "tls:" and a certificate's name, or "ip:" and an
// address range. The zero ID is a request of no known client (one made
// inside the node).
type ID string

// Of returns the ID of a client connected from remote (host:port, as
// net/http's RemoteAddr and gRPC's peer address give it) over a
// connection of state (nil: not TLS).
func Of(remote string, state *tls.ConnectionState) ID {
	if state != nil && len(state.VerifiedChains) > 0 && len(state.VerifiedChains[0]) > 0 {
		leaf := state.VerifiedChains[0][0]
		switch {
		case leaf.Subject.CommonName != "":
			return ID("tls:" + leaf.Subject.CommonName)
		case len(leaf.DNSNames) > 0:
			return ID("tls:" + leaf.DNSNames[0])
		case len(leaf.URIs) > 0:
			return ID("tls:" + leaf.URIs[0].String())
		}
	}
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		if host, _, splitErr := net.SplitHostPort(remote); splitErr == nil {
			remote = host
		}
		a, err := netip.ParseAddr(remote)
		if err != nil {
			return ID("addr:" + remote) // not IP (a Unix socket): the address itself
		}
		ap = netip.AddrPortFrom(a, 0)
	}
	a := ap.Addr().Unmap()
	bits := 64
	if a.Is4() {
		bits = 24
	}
	p, _ := a.Prefix(bits) // never fails for these bit counts
	return ID("ip:" + p.String())
}

type key struct{}

// NewContext returns ctx carrying id, for FromContext.
func NewContext(ctx context.Context, id ID) context.Context { return context.WithValue(ctx, key{}, id) }

// FromContext returns the client of the request ctx belongs to: the ID
// NewContext gave it (the HTTP face does), else that of the gRPC
// connection the call arrived on, else the zero ID.
func FromContext(ctx context.Context) ID {
	if id, ok := ctx.Value(key{}).(ID); ok {
		return id
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	var state *tls.ConnectionState
	if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
		state = &info.State
	}
	return Of(p.Addr.String(), state)
}
