package peer

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/top"
)

// TopHandler is a node's side of Peer/Top: a Handler that also
// implements it answers what it counted of who is being limited; Server
// answers codes.Unimplemented for a Handler that does not.
type TopHandler interface {
	// Top reports the node's counts, at most keys keys per list.
	Top(keys int) top.Report
	// ReplicationLag is how far the node's replicas are behind.
	ReplicationLag() time.Duration
}

// maxTopBytes bounds a Top answer as its asker reads it: top.MaxNames
// names of two lists of top.MaxKeys keys of top.MaxKeyBytes, and their
// counts, take under 1.2 MB.
const maxTopBytes = 3 << 19

// Top asks the node at addr, as node from, for its counts of who is being
// limited, with at most keys keys per list. An answer larger than a
// node's own reports can be, or otherwise invalid (top.Report.Validate),
// is refused with an error naming the field at fault; the rates are
// worked out here, from the counts.
func (p *Pool) Top(ctx context.Context, addr, from string, keys int) (top.Report, time.Duration, error) {
	bounded := func(c peerpb.PeerClient, ctx context.Context, req *peerpb.TopRequest, opts ...grpc.CallOption) (*peerpb.TopResponse, error) {
		return c.Top(ctx, req, append(opts, grpc.MaxCallRecvMsgSize(maxTopBytes))...)
	}
	resp, err := unary(ctx, p, "top", addr, bounded, &peerpb.TopRequest{From: from, Keys: uint32(min(max(keys, 0), top.MaxKeys))})
	if err != nil {
		return top.Report{}, 0, err
	}
	r := reportOf(resp)
	if err := r.Validate(); err != nil {
		return top.Report{}, 0, fmt.Errorf("top from %s: %w", addr, err)
	}
	if lag := resp.GetReplicationLagMs(); lag < 0 {
		return top.Report{}, 0, fmt.Errorf("top from %s: replication_lag_ms: %d, negative", addr, lag)
	}
	r.SetRates()
	return r, time.Duration(resp.GetReplicationLagMs()) * time.Millisecond, nil
}

// Top answers what the Handler counted of who is being limited. It
// refuses a malformed sender's name, or more keys than top.MaxKeys, with
// codes.InvalidArgument.
func (s *Server) Top(_ context.Context, req *peerpb.TopRequest) (*peerpb.TopResponse, error) {
	if err := s.checkSender("top", req.GetFrom()); err != nil {
		return nil, err
	}
	if req.GetKeys() > top.MaxKeys {
		return nil, status.Errorf(codes.InvalidArgument, "keys: %d, more than %d", req.GetKeys(), top.MaxKeys)
	}
	h, ok := s.h.(TopHandler)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this node counts no keys")
	}
	resp := responseOf(h.Top(int(req.GetKeys())))
	resp.ReplicationLagMs = h.ReplicationLag().Milliseconds()
	return resp, nil
}

func responseOf(r top.Report) *peerpb.TopResponse {
	resp := &peerpb.TopResponse{IntervalMs: int64(r.Seconds * 1000), Checks: r.Checks, Refusals: r.Refusals}
	for _, l := range r.Limits {
		resp.Limits = append(resp.Limits, &peerpb.TopLimit{Name: l.Name, Truncated: l.Truncated, Checks: l.Checks,
			Hot: topKeysOf(l.Hot), Refused: topKeysOf(l.Refused)})
	}
	return resp
}

func topKeysOf(ks []top.Key) []*peerpb.TopKey {
	out := make([]*peerpb.TopKey, len(ks))
	for i, k := range ks {
		out[i] = &peerpb.TopKey{Key: k.Key, Truncated: k.Truncated, Checks: k.Checks, Refusals: k.Refusals, Error: k.Error}
	}
	return out
}

func reportOf(resp *peerpb.TopResponse) top.Report {
	r := top.Report{Seconds: float64(resp.GetIntervalMs()) / 1000, Checks: resp.GetChecks(), Refusals: resp.GetRefusals()}
	for _, l := range resp.GetLimits() {
		r.Limits = append(r.Limits, top.Limit{Name: l.GetName(), Truncated: l.GetTruncated(), Checks: l.GetChecks(),
			Hot: reportKeys(l.GetHot()), Refused: reportKeys(l.GetRefused())})
	}
	return r
}

func reportKeys(ks []*peerpb.TopKey) []top.Key {
	out := make([]top.Key, len(ks))
	for i, k := range ks {
		out[i] = top.Key{Key: k.GetKey(), Truncated: k.GetTruncated(), Checks: k.GetChecks(), Refusals: k.GetRefusals(), Error: k.GetError()}
	}
	return out
}
