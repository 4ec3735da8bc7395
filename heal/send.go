package heal

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/ring"
)

// Sends. Every request this node sends another member to decide goes
// through the Node: a send to a suspect fails at once with ErrSuspect,
// rather than wait out the forward deadline again, and a send that finds
// its member unreachable makes it suspect, which releases the other sends
// in flight to it (see Watch).

// How is how a request goes to a member.
type How uint8

const (
	Forward How = iota // to the key's owner, which may relay or pull it
	Relay              // to a node that decides it where it lands (peer.Pool.Relay)
	Pull               // to the key's previous owner, which decides it only if it holds the counter (peer.Pool.Pull)
)

// Sending is a batched forward on its way to its owner (see Start).
type Sending struct {
	f     peer.Forwarding // nil when err is set
	watch context.Context // ends when the owner becomes suspect
	addr  string
	err   error // ErrSuspect: not sent, the owner is suspect
}

// Start hands req to the batch for owner (peer.Pool.Start), unless owner
// is suspect; Finish waits for its answer. Starting every batched send of
// a request before waiting for any lets them share their batches.
func (n *Node) Start(ctx context.Context, owner ring.Member, req *pb.CheckRequest) *Sending {
	st := &Sending{addr: owner.PeerAddr}
	st.watch = n.Watch(owner.PeerAddr) // before asking: a suspicion from now on releases this forward
	if n.Suspect(owner.PeerAddr) {
		st.err = ErrSuspect
		return st
	}
	st.f = n.peers.Start(ctx, owner.PeerAddr, req)
	return st
}

// Finish waits for the answer to st. A forward that finds its owner
// unreachable makes it suspect, and so releases the other forwards in
// flight to it, which fail with ErrSuspect too.
func (n *Node) Finish(ctx context.Context, st *Sending) (*pb.CheckResponse, error) {
	if st.err != nil {
		return nil, st.err
	}
	resp, err := st.f.Wait(st.watch.Done())
	if err != nil && ctx.Err() == nil && st.watch.Err() != nil {
		return nil, ErrSuspect
	}
	if Failed(ctx, err) {
		n.Mark(st.addr)
	}
	return resp, err
}

// Forward sends req to owner in its batch and waits for the answer, as
// Start and Finish do.
func (n *Node) Forward(ctx context.Context, owner ring.Member, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	return n.Finish(ctx, n.Start(ctx, owner, req))
}

// Send sends req to to as how says, in an RPC of its own, and waits for
// the answer. A pull's answer that the member does not hold the counter
// (peer.ErrNotHere) is an answer: the member is not suspect.
func (n *Node) Send(ctx context.Context, to ring.Member, how How, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	watch := n.Watch(to.PeerAddr) // before asking: a suspicion from now on releases this send
	if n.Suspect(to.PeerAddr) {
		return nil, ErrSuspect
	}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(watch, func() { cancel(ErrSuspect) })()
	var resp *pb.CheckResponse
	var err error
	switch how {
	case Pull:
		resp, err = n.peers.Pull(fctx, to.PeerAddr, req)
		if errors.Is(err, peer.ErrNotHere) {
			return nil, err
		}
	case Relay:
		resp, err = n.peers.Relay(fctx, to.PeerAddr, req)
	default:
		resp, err = n.peers.ForwardNow(fctx, to.PeerAddr, req)
	}
	if err != nil && ctx.Err() == nil && context.Cause(fctx) == ErrSuspect {
		return nil, ErrSuspect
	}
	if Failed(ctx, err) {
		n.Mark(to.PeerAddr)
	}
	return resp, err
}

// Unreachable logs, at most once a second per owner, that owner could not
// be reached, and what this node did instead (msg); metrics count every
// such event, so that a partition that fails every forward does not fill
// the log.
func (n *Node) Unreachable(owner, msg string, err error) {
	if n.logged.allow(owner, time.Now()) {
		n.log.Warn(msg+" (logged once a second per owner)", "owner", owner, "err", err)
	}
}

// sampler lets through one event a second per key.
type sampler struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// allow reports whether an event of key at now is let through.
func (s *sampler) allow(key string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.last[key]) < time.Second {
		return false
	}
	if s.last == nil || len(s.last) > 1000 {
		s.last = make(map[string]time.Time) // keys are owners: few, but bounded anyway
	}
	s.last[key] = now
	return true
}
