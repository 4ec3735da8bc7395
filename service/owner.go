package service

import (
	"context"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/peer"
)

// Owner is the service's side of peer traffic: what other nodes ask of
// this one as a key's owner. It implements peer.Handler and is safe for
// concurrent use.
type Owner struct{ s *Service }

// Owner returns the service's side of peer traffic.
func (s *Service) Owner() Owner { return Owner{s} }

// Forwarded decides requests another node forwarded here, as their owner:
// by the same switch as any check, with this node as every key's owner,
// and never forwarding them again as such (while rings disagree that could
// loop). But when this node's ring gives a key to another node and this
// node holds no counter for it, the counter is elsewhere: this node handed
// it off already (the sender's ring lags), or it has not come yet (this
// node's lags) and the other node still has it. Then the check is relayed,
// once, to the owner in this node's ring, which decides it where it lands
// (Relayed). A node that is leaving (Service.Leave) does the same with
// every check: it decides those whose counter it still holds, and relays
// the others. See settle, which decides which is which at a moment
// when no counter is on its way.
func (o Owner) Forwarded(ctx context.Context, reqs []*pb.CheckRequest) []*pb.CheckResponse {
	out, _ := o.s.forwarded(ctx, reqs, true, false)
	return out
}

// Pulled decides requests a key's new owner sent here, to this node as
// their previous owner (see plan): as their owner if this node
// holds the counter of every check of every request (its own, or the
// replica of the key's owner, which becomes its counter: see
// custody.Custody.Pulled), never passing them
// on; otherwise it decides nothing and returns peer.ErrNotHere. Each
// check is decided only on a counter still here (limiter.Request.Held),
// looked for again under the lock that decides it: a round of hand-off
// can take the counter out after the first look, and a check decided then
// would start it afresh beside the one on its way, which the new owner
// would merge as the more charged of the two. If one is not here by
// then, Pulled returns peer.ErrNotHere too, and the new owner decides the
// requests, waiting for the counter; the checks decided here before it
// are charged twice, the safe side.
func (o Owner) Pulled(ctx context.Context, reqs []*pb.CheckRequest) ([]*pb.CheckResponse, error) {
	for _, req := range reqs {
		c, err := o.s.prepare(req, nil)
		if err != nil {
			return nil, peer.ErrNotHere // invalid here as at the new owner: let it answer
		}
		for j := range c.reqs {
			if !o.s.custody.Pulled(&c.reqs[j]) {
				return nil, peer.ErrNotHere
			}
		}
	}
	out, notHeld := o.s.forwarded(ctx, reqs, false, true)
	if notHeld {
		return nil, peer.ErrNotHere
	}
	return out, nil
}

// Relayed decides requests another node relayed here (see Forwarded): as
// their owner, never relaying them again, even if this node is leaving
// too or its ring disagrees.
func (o Owner) Relayed(ctx context.Context, reqs []*pb.CheckRequest) []*pb.CheckResponse {
	out, _ := o.s.forwarded(ctx, reqs, false, false)
	return out
}

// forwarded decides requests forwarded here, as their owner or, if
// mayRelay, by relaying those whose counter is elsewhere (see Forwarded).
// held says each check is decided only on a counter held here (see
// Pulled); notHeld reports that one was not.
func (s *Service) forwarded(ctx context.Context, reqs []*pb.CheckRequest, mayRelay, held bool) (out []*pb.CheckResponse, notHeld bool) {
	out = make([]*pb.CheckResponse, len(reqs))
	self := s.cluster.LocalMember()
	began := s.custody.AwaitJoin(ctx) // a node that has not joined yet routes by the ring it joins
	r := s.custody.Ring()
	for i, req := range reqs {
		c, err := s.prepare(req, nil)
		if err != nil {
			out[i] = &pb.CheckResponse{Responses: make([]*pb.CheckResult, len(req.GetRequests()))}
			for k := range out[i].Responses {
				out[i].Responses[k] = errorResult(err)
			}
			continue
		}
		c.ring, c.began = r, began
		if held {
			c.onlyHeld()
		}
		ps := c.pendings()
		for j := range ps {
			ps[j] = pending{j: j, to: self, recheck: mayRelay} // settle relays what is elsewhere
			if !mayRelay {
				ps[j].next = nextHere // relayed or pulled here: decided here, never passed on
			}
		}
		s.decide(ctx, c, ps)
		out[i] = &pb.CheckResponse{Responses: c.results}
		notHeld = notHeld || c.notHeld
	}
	return out, notHeld
}

// AddGlobalHits takes node from's reports of GLOBAL counters this node
// owns; new grants and state go out with the next broadcast. It refuses
// reports from a node that is not a member (see global.Node.Receive).
func (o Owner) AddGlobalHits(_ context.Context, from string, reports []*peerpb.GlobalReport) error {
	return o.s.global.Receive(from, reports)
}

// UpdateGlobals takes owner from's broadcast of GLOBAL counters. It
// refuses a broadcast from a node that is not a member, and each state
// whose key from does not own (see global.Node.Apply).
func (o Owner) UpdateGlobals(_ context.Context, from string, states []*peerpb.GlobalState) error {
	return o.s.global.Apply(from, states)
}

// Lease takes the reports of lessee's account that node from relayed, for
// keys this node owns (see lease.Node.Relayed). It implements
// peer.LeaseHandler.
func (o Owner) Lease(ctx context.Context, from string, lessee []byte, reports []*pb.LeaseReport) ([]*pb.LeaseGrant, error) {
	return o.s.leases.Relayed(ctx, from, lessee, reports)
}

// HandOff merges counters another node no longer owns into this node's
// store (see custody.Custody.Received) and returns a Refusal for each it
// did not take.
func (o Owner) HandOff(_ context.Context, from string, counters []*peerpb.CounterState) []*peerpb.Refusal {
	return o.s.custody.Received(from, counters)
}

// HandOffDone takes node from's word that it has handed this node every
// counter it held for keys this node owns in the ring whose ID is ring
// (see custody.Custody.HandOffDone).
func (o Owner) HandOffDone(_ context.Context, from string, ring uint64) {
	o.s.custody.HandOffDone(from, ring)
}

// Left takes node from's last word that it has left the cluster, holding
// no counter of the keys this node owns in the ring whose ID is ring: in
// strict mode the keys this node took over from it are then decided at
// once, not fenced (see docs/strict.md, "A graceful leave: no fence"). It
// returns an error when it does not take the word.
func (o Owner) Left(_ context.Context, from string, ring uint64) error {
	if err := o.s.strict.TakeLeft(from, ring, o.s.now()); err != nil {
		return err
	}
	if o.s.strict.On() {
		o.s.log.Info("strict mode: a member left having handed its counters over; its keys are not fenced", "member", from)
	}
	return nil
}

// Replicate keeps copies of counters that node from owns, to take over
// should from crash (see custody.Custody.Replicated), and returns a
// Refusal for each it did not keep.
func (o Owner) Replicate(_ context.Context, from string, counters []*peerpb.CounterState) []*peerpb.Refusal {
	return o.s.custody.Replicated(from, counters)
}
