package node

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/ringlimit/ringlimit/internal/conns"
)

// listeners are a node's sockets, opened before anything is served so that
// a port conflict fails fast and tests can use port 0.
type listeners struct {
	http, grpc, peer net.Listener
	resp             net.Listener // nil without Config.RESPAddr
}

func listen(conf Config) (lis listeners, err error) {
	defer func() {
		if err != nil {
			lis.close()
		}
	}()
	if lis.http, err = net.Listen("tcp", conf.HTTPAddr); err != nil {
		return lis, fmt.Errorf("--http-addr: %w", err)
	}
	if lis.grpc, err = net.Listen("tcp", conf.GRPCAddr); err != nil {
		return lis, fmt.Errorf("--grpc-addr: %w", err)
	}
	if lis.peer, err = net.Listen("tcp", conf.PeerAddr); err != nil {
		return lis, fmt.Errorf("--peer-addr: %w", err)
	}
	if conf.RESPAddr != "" {
		if lis.resp, err = net.Listen("tcp", conf.RESPAddr); err != nil {
			return lis, fmt.Errorf("--resp-addr: %w", err)
		}
	}
	return lis, nil
}

// close closes the listeners that are open; servers that took them close
// them too, which is harmless.
func (l listeners) close() {
	for _, c := range []net.Listener{l.http, l.grpc, l.peer, l.resp} {
		if c != nil {
			c.Close()
		}
	}
}

// DefaultMaxConns is the default of Config.MaxConns: each open connection
// holds buffers (tens of KB for gRPC), so a flood of idle ones is bounded
// at some hundreds of MB per listener.
const DefaultMaxConns = 4096

// The shares of a listener's connections, from --max-conns and
// --max-conns-per-source (see docs/security.md, "Connection and stream
// slots"). A connection is pending until it makes its first request
// (conns.Established): an HTTP request, a gRPC call, a RESP command.
const (
	// rangeShare is a range's share (a /24, a /64) in sources' shares:
	// twice one source's, so that a flood from many addresses of one
	// network holds what two hosts may, and a proxy fleet in one range
	// has room (a quarter of --max-conns, by default).
	rangeShare = 2
	// pendingShare divides a source's share into its pending share: 64
	// of the default 512, far more than a proxy opens at once, each
	// pending for a round trip or two.
	pendingShare = 8
	// pendingPool divides --max-conns into the pending pool: 512 of the
	// default 4,096, for at most --handshake-timeout each.
	pendingPool = 8
)

// connConfig is the bounds of the listener name: MaxConns open, pending or
// established; an established connection within MaxConnsPerSource from
// its IP address and rangeShare times that from its range; a pending one
// within its pending share of those, in a pool of MaxConns/pendingPool,
// and for HandshakeTimeout at most. Zero MaxConnsPerSource bounds neither
// sources nor ranges.
func (c Config) connConfig(name string, m *conns.Metrics) conns.Config {
	source, pendingSource := c.MaxConnsPerSource, 0
	if source > 0 {
		pendingSource = max(1, source/pendingShare)
	}
	return conns.Config{
		Name:           name,
		Max:            c.MaxConns,
		PerSource:      source,
		PerRange:       rangeShare * source,
		Pending:        conns.Bounds{Max: max(rangeShare*pendingSource, c.MaxConns/pendingPool), PerSource: pendingSource, PerRange: rangeShare * pendingSource},
		PendingTimeout: c.HandshakeTimeout,
		Metrics:        m,
	}
}

// limit bounds each listener as connConfig says (see package conns);
// connections from the addresses member names are admitted to the peer
// port ahead of strangers. Memberlist's gossip listener is its own and is
// not bounded here.
func (l listeners) limit(conf Config, m *conns.Metrics, member func(netip.Addr) bool) listeners {
	bound := func(lis net.Listener, name string) *conns.Listener {
		return conns.Limit(lis, conf.connConfig(name, m))
	}
	peer := conf.connConfig("peer", m)
	peer.Kept = member
	bounded := listeners{http: bound(l.http, "http"), grpc: bound(l.grpc, "grpc"), peer: conns.Limit(l.peer, peer)}
	if l.resp != nil {
		bounded.resp = bound(l.resp, "resp")
	}
	return bounded
}
