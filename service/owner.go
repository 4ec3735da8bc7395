package service

import (
	"context"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// Owner is the service's side of peer traffic: what other nodes ask of
// this one as a key's owner. It implements peer.Handler and is safe for
// concurrent use.
type Owner struct{ s *Service }

// Owner returns the service's side of peer traffic.
func (s *Service) Owner() Owner { return Owner{s} }

// Forwarded decides requests another node forwarded here. The sender chose
// this node as the owner, so they are decided here whatever this node's
// ring says (forwarding again could loop while rings disagree): by the
// same switch as any check, with this node as every key's owner. But a
// node that is leaving (Service.Leave) has handed its counters over, or is
// handing them over: it relays each check to the key's owner in the ring
// without itself, once.
func (o Owner) Forwarded(ctx context.Context, reqs []*pb.CheckRequest) []*pb.CheckResponse {
	return o.s.forwarded(ctx, reqs, o.s.leaving.Load() != nil)
}

// Relayed decides requests a leaving node relayed here: as Forwarded, but
// never relaying them again, even if this node is leaving too.
func (o Owner) Relayed(ctx context.Context, reqs []*pb.CheckRequest) []*pb.CheckResponse {
	return o.s.forwarded(ctx, reqs, false)
}

// forwarded decides requests forwarded here, as their owner or, with
// relay, by relaying them to their owner in the ring this node routes by.
func (s *Service) forwarded(ctx context.Context, reqs []*pb.CheckRequest, relay bool) []*pb.CheckResponse {
	out := make([]*pb.CheckResponse, len(reqs))
	self := s.cluster.LocalMember()
	r := s.ring()
	for i, req := range reqs {
		c, err := s.prepare(req)
		if err != nil {
			out[i] = &pb.CheckResponse{Responses: make([]*pb.CheckResult, len(req.GetRequests()))}
			for k := range out[i].Responses {
				out[i].Responses[k] = errorResult(err)
			}
			continue
		}
		c.ring, c.relay = r, relay
		for j := range c.owners {
			c.owners[j] = self
			if relay {
				c.owners[j], _ = r.Owner(c.reqs[j].Key) // the last node of the cluster has none: it decides
			}
		}
		s.decide(ctx, c, every(len(c.reqs)))
		out[i] = &pb.CheckResponse{Responses: c.results}
	}
	return out
}

// AddGlobalHits takes node from's reports of GLOBAL counters this node
// owns; new grants and state go out with the next broadcast. It refuses
// reports from a node that is not a member (see global.Node.Receive).
func (o Owner) AddGlobalHits(_ context.Context, from string, reports []*pb.GlobalReport) error {
	return o.s.global.Receive(from, reports)
}

// UpdateGlobals takes owner from's broadcast of GLOBAL counters. It
// refuses a broadcast from a node that is not a member, and each state
// whose key from does not own (see global.Node.Apply).
func (o Owner) UpdateGlobals(_ context.Context, from string, states []*pb.GlobalState) error {
	return o.s.global.Apply(from, states)
}

// HandOff merges counters another node no longer owns into this node's
// store (see handoff.Node.Receive) and returns a Refusal for each it did
// not take.
func (o Owner) HandOff(_ context.Context, from string, counters []*pb.CounterState) []*pb.Refusal {
	return o.s.handoff.Receive(from, counters)
}

// HandOffDone takes node from's word that it has handed this node every
// counter it held for keys this node owns in the ring whose ID is ring
// (see handoff.Node.HandOffDone).
func (o Owner) HandOffDone(_ context.Context, from string, ring uint64) {
	o.s.handoff.HandOffDone(from, ring)
}

// Replicate keeps copies of counters that node from owns, to take over
// should from crash (see replica.Node.Receive), and returns a Refusal for
// each it did not keep.
func (o Owner) Replicate(_ context.Context, from string, counters []*pb.CounterState) []*pb.Refusal {
	return o.s.replica.Receive(from, counters)
}
