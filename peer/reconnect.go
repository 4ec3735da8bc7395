package peer

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// reconnect is how a Pool's connections come back once their peer can be
// reached again. gRPC's default waits up to 2 minutes between attempts
// (1s, growing 1.6 times each) and gives an attempt 20s: after a network
// partition of 20s the nodes on either side went on failing every call to
// the other side for seconds after the network healed (their attempt in
// flight waited for a SYN retransmit, the next was seconds away), deciding
// the other side's keys by failover meanwhile, while gossip already said
// the peer was alive. A peer is one hop away on the cluster's network: an
// attempt that has not connected within a second will not, and a second
// between attempts costs little. So a connection comes back within about
// two seconds of the peer answering again, and a suspect owner's next
// probe finds it (service's suspects).
var reconnect = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: time.Second,
})
