package peer

import (
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
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

// Reset closes the connection to addr if it is up (connectivity.Ready)
// and drops it, as Retain drops an address, so that the next call dials
// afresh; it reports whether it did. A call that timed out on a
// connection gRPC holds ready is a sign that the connection is stuck: a
// TCP connection across a network cut stays established, and once the
// cut heals its retransmissions, backed off while it lasted, may not
// reach the peer for many seconds more, while every call on it waits its
// deadline and a new connection would answer at once. So a node that
// suspects an owner resets its connection when a probe times out.
func (p *Pool) Reset(addr string) bool {
	p.mu.Lock()
	c, ok := p.peers[addr]
	if !ok || c.cc.GetState() != connectivity.Ready {
		p.mu.Unlock()
		return false
	}
	delete(p.peers, addr)
	c.batch.Close(fmt.Errorf("%w: connection reset", ErrUnreachable))
	p.mu.Unlock()
	_ = c.close() // fails only if already closed
	return true
}

// Revive has the connection to addr try again at once if it is failing:
// one waiting out its backoff between attempts (TransientFailure) tries
// again now, and one whose attempt is still in flight (Connecting) is
// replaced: the next call dials afresh, while the calls already waiting
// on it keep it until they end (see retire); it reports whether it did
// either. Gossip saying a member is back is a better sign than the
// backoff's clock: after a partition the members find each other again
// within a second of the heal (they reconnect to members declared dead),
// while a dial sent into the cut waited out its second's timeout (its SYN
// lost, the retransmission due as late) and the backoff after it, and
// every forward meanwhile was failed over. A node revives every member
// of a new ring (package heal).
func (p *Pool) Revive(addr string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.peers[addr]
	if !ok {
		return false
	}
	switch c.cc.GetState() {
	case connectivity.TransientFailure:
		c.cc.ResetConnectBackoff()
		return true
	case connectivity.Connecting:
		delete(p.peers, addr)
		p.retire(c)
		return true
	}
	return false
}

// retire closes c, taken out of the pool, once the calls on it have had
// their time (Config.Timeout), rather than at once: a connection still
// connecting is most often a new one about to answer (a node that has
// just started dials its members while its ring changes as it joins), and
// one to a member that has left carries answers the member still sends
// (see Retain). Closing either failed its calls with "the client
// connection is closing": forwards failed over while their owner was
// there, or decided twice. Close closes the retired too. p.mu is held.
func (p *Pool) retire(c *conn) {
	if p.retired == nil {
		p.retired = make(map[*conn]*time.Timer)
	}
	p.retired[c] = time.AfterFunc(p.conf.Timeout, func() {
		p.mu.Lock()
		_, ok := p.retired[c]
		delete(p.retired, c)
		p.mu.Unlock()
		if ok {
			c.batch.Close(fmt.Errorf("%w: connection revived", ErrUnreachable))
			_ = c.close() // fails only if already closed
		}
	})
}
