package service

import (
	"context"
	"errors"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
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
// same switch as any check, with this node as every key's owner.
func (o Owner) Forwarded(ctx context.Context, reqs []*pb.CheckRequest) []*pb.CheckResponse {
	out := make([]*pb.CheckResponse, len(reqs))
	self := o.s.cluster.LocalMember()
	for i, req := range reqs {
		c, err := o.s.prepare(req)
		if err != nil {
			out[i] = &pb.CheckResponse{Responses: make([]*pb.CheckResult, len(req.GetRequests()))}
			for k := range out[i].Responses {
				out[i].Responses[k] = errorResult(err)
			}
			continue
		}
		for j := range c.owners {
			c.owners[j] = self
		}
		o.s.decide(ctx, c, every(len(c.reqs)))
		out[i] = &pb.CheckResponse{Responses: c.results}
	}
	return out
}

// AddGlobalHits takes node from's reports of GLOBAL counters this node
// owns; new grants and state go out with the next broadcast.
func (o Owner) AddGlobalHits(_ context.Context, from string, reports []*pb.GlobalReport) {
	o.s.global.Receive(from, reports)
}

// UpdateGlobals takes an owner's broadcast of GLOBAL counters.
func (o Owner) UpdateGlobals(_ context.Context, states []*pb.GlobalState) {
	o.s.global.Apply(states)
}

// HandOff merges counters another node no longer owns into this node's
// store, validating each against this node's clock and maximum clock
// skew, and returns a Refusal for each it did not take: a record or state
// of an unknown version, or one that does not decode or is impossible for
// its limit. Refusals are logged (once per call) and counted.
func (o Owner) HandOff(_ context.Context, from string, counters []*pb.CounterState) []*pb.Refusal {
	now := o.s.now()
	var refused []*pb.Refusal
	for i, cs := range counters {
		var c limiter.Counter
		err := c.UnmarshalBinary(cs.GetCounter())
		if err == nil {
			err = o.s.store.Merge(c, now, o.s.skew)
		}
		if err != nil {
			r := &pb.Refusal{Index: int32(i), Reason: pb.Refusal_UNAVAILABLE, Detail: err.Error()}
			switch {
			case errors.Is(err, limiter.ErrUnknownVersion):
				r.Reason = pb.Refusal_UNKNOWN_VERSION
			case errors.Is(err, limiter.ErrBadCounter):
				r.Reason = pb.Refusal_INVALID
			}
			o.s.metrics.handOffRefused.WithLabelValues("received", refusedLabel(r.Reason)).Inc()
			refused = append(refused, r)
		}
	}
	if len(refused) > 0 {
		o.s.log.Warn("hand-off: counters refused", "from", from, "refused", len(refused), "of", len(counters),
			"first", refused[0].GetDetail())
	}
	o.s.metrics.handedOff.WithLabelValues("received").Add(float64(len(counters) - len(refused)))
	return refused
}
