package main

import "golang.org/x/net/netutil"

// defaultMaxConns is the default of --max-conns: each open connection
// holds buffers (tens of KB for gRPC), so a flood of idle ones is bounded
// at some hundreds of MB per listener.
const defaultMaxConns = 4096

// limit bounds each listener to n connections open at once: beyond it, new
// connections wait in the kernel's backlog until one closes. Memberlist's
// gossip listener is its own and is not bounded here.
func (l listeners) limit(n int) listeners {
	return listeners{
		http: netutil.LimitListener(l.http, n),
		grpc: netutil.LimitListener(l.grpc, n),
		peer: netutil.LimitListener(l.peer, n),
	}
}
