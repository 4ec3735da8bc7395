package node

import (
	"fmt"
	"net"

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

// limit bounds each listener to conf.MaxConns connections open at once,
// and conf.MaxConnsPerSource from one IP address: beyond either, a new
// connection is closed as soon as it is accepted (see package conns).
// Memberlist's gossip listener is its own and is not bounded here.
func (l listeners) limit(conf Config, m *conns.Metrics) listeners {
	bound := func(lis net.Listener, name string) net.Listener {
		return conns.Limit(lis, conns.Config{Name: name, Max: conf.MaxConns, PerSource: conf.MaxConnsPerSource, Metrics: m})
	}
	bounded := listeners{http: bound(l.http, "http"), grpc: bound(l.grpc, "grpc"), peer: bound(l.peer, "peer")}
	if l.resp != nil {
		bounded.resp = bound(l.resp, "resp")
	}
	return bounded
}
