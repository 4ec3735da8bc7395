// Package rls serves Envoy's rate limit service protocol,
// envoy.service.ratelimit.v3.RateLimitService, so that Envoy (and Istio,
// Contour, Emissary, Gloo) can ask ringlimit instead of
// envoyproxy/ratelimit, answering what it answers (commit f2fb157) for the
// same configuration and requests.
//
// Each descriptor is looked up in the policies (package policy); the
// limits left after unlimited and replaces become the items of one check,
// so that descriptor counters shard on the ring by key and are exact
// across the cluster. They use envoyproxy/ratelimit's fixed window, which
// counts refused hits too (charge_refused), but for a policy with our
// min_interval_ms, decided our way. hits_addend (per request, or per
// descriptor since Envoy 1.33) is the hits; 0 checks without charging;
// under a policy with reserve_ttl_ms it is charged whether or not it fits,
// as a settle is (apply_on_stream_done). See docs/envoy.md.
package rls

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/policy"
)

// Checker decides ringlimit checks: *service.Service.
type Checker interface {
	Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error)
}

// Policies returns the policies in force: *policy.Reloader. A nil Set
// means no policy file was given, and every request is an error.
type Policies interface {
	Policies() *policy.Set
}

// The bounds of a request, those of a native check (package checks).
const (
	// MaxDescriptors is the most descriptors one request may carry: each
	// becomes at most one item of one check.
	MaxDescriptors = checks.MaxItems
	// MaxHits bounds hits_addend, as a check's hits.
	MaxHits = checks.MaxLimit
	// maxKeyLen is the longest counter key sent as is; a longer one is
	// replaced by its SHA-256, as ringlimit keys are at most
	// limiter.MaxKeyLen bytes.
	maxKeyLen = limiter.MaxKeyLen
)

// Config configures a Server.
type Config struct {
	Checker  Checker
	Policies Policies
	// UnknownDomain, if not nil, is told of each request for a domain no
	// policy file has (policy.UnknownDomains.Saw); the request is answered OK.
	UnknownDomain func(domain string)
	// Now is the clock of duration_until_reset; nil means time.Now.
	Now func() time.Time
}

// Server answers ShouldRateLimit. It is safe for concurrent use.
type Server struct {
	rlspb.UnimplementedRateLimitServiceServer
	checker  Checker
	policies Policies
	now      func() time.Time
	unknown  func(domain string)
}

// New returns a Server.
func New(conf Config) *Server {
	s := &Server{checker: conf.Checker, policies: conf.Policies, now: conf.Now, unknown: conf.UnknownDomain}
	if s.now == nil {
		s.now = time.Now
	}
	return s
}

// Register registers s on srv.
func (s *Server) Register(srv grpc.ServiceRegistrar) {
	rlspb.RegisterRateLimitServiceServer(srv, s)
}

// applied is the limit that applies to one descriptor of a request.
type applied struct {
	limit     *policy.Limit // nil: no limit (none matched, replaced or unlimited)
	unlimited bool
	shared    []string // share_threshold values, see policy.Match
	entries   []policy.Entry
	hits      int64
	item      int // index of its check item
}

// ShouldRateLimit decides every descriptor of req.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	descs := req.GetDescriptors()
	switch {
	case req.GetDomain() == "":
		return nil, status.Error(codes.InvalidArgument, "domain: must not be empty")
	case len(descs) == 0:
		return nil, status.Error(codes.InvalidArgument, "descriptors: must not be empty")
	case len(descs) > MaxDescriptors:
		return nil, status.Errorf(codes.InvalidArgument, "descriptors: %d, at most %d allowed", len(descs), MaxDescriptors)
	}
	set := s.policies.Policies()
	if set == nil {
		return nil, status.Error(codes.FailedPrecondition, "no policies: start rlnode with --policy-file")
	}
	as, err := s.limits(set, req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	check := &pb.CheckRequest{}
	for i := range as {
		a := &as[i]
		if a.limit == nil {
			continue
		}
		a.item = len(check.Requests)
		check.Requests = append(check.Requests, checkItem(req.GetDomain(), a))
	}
	var results []*pb.CheckResult
	if len(check.Requests) > 0 {
		resp, err := s.checker.Check(ctx, check)
		if err != nil {
			return nil, status.Errorf(checks.Code(err), "check: %v", err)
		}
		results = resp.GetResponses()
		if len(results) != len(check.Requests) {
			return nil, status.Errorf(codes.Internal, "check: %d results for %d items", len(results), len(check.Requests))
		}
		if err := s.force(ctx, as, check.Requests, results); err != nil {
			return nil, err
		}
	}
	return s.answer(as, results)
}

// force charges, down to an empty counter, the hits of every descriptor
// of as that a policy with reserve_ttl_ms has charged for work done but
// that its check refused, and does not count (all algorithms but the
// fixed window's charge_refused): one more check, of what each counter
// has left. The refusal stands in the answer.
func (s *Server) force(ctx context.Context, as []applied, items []*pb.CheckItem, results []*pb.CheckResult) error {
	var rest *pb.CheckRequest
	for _, a := range as {
		if a.limit == nil || a.limit.ReserveTTL == 0 || a.hits == 0 {
			continue
		}
		item, r := items[a.item], results[a.item]
		if item.ChargeRefused || r.GetStatus() != pb.Status_OVER_LIMIT || r.GetRemaining() == 0 || r.GetError() != "" {
			continue
		}
		if rest == nil {
			rest = &pb.CheckRequest{}
		}
		left := proto.CloneOf(item)
		left.Hits = &r.Remaining
		rest.Requests = append(rest.Requests, left)
	}
	if rest == nil {
		return nil
	}
	if _, err := s.checker.Check(ctx, rest); err != nil {
		return status.Errorf(checks.Code(err), "check: %v", err)
	}
	return nil
}

// limits finds the limit of each descriptor of req, then drops those that
// another applied limit replaces.
func (s *Server) limits(set *policy.Set, req *rlspb.RateLimitRequest) ([]applied, error) {
	domain := req.GetDomain()
	known := set.HasDomain(domain)
	if !known && s.unknown != nil {
		s.unknown(domain)
	}
	as := make([]applied, len(req.GetDescriptors()))
	replaced := map[string]bool{}
	for i, d := range req.GetDescriptors() {
		hits := max(1, int64(req.GetHitsAddend()))
		if h := d.GetHitsAddend(); h != nil {
			if h.GetValue() > MaxHits {
				return nil, fmt.Errorf("descriptors[%d].hits_addend: %d, at most %d allowed", i, h.GetValue(), MaxHits)
			}
			hits = int64(h.GetValue()) // 0 checks without counting
		}
		if hits > MaxHits {
			return nil, fmt.Errorf("hits_addend: %d, at most %d allowed", hits, MaxHits)
		}
		as[i].hits = hits
		if !known {
			continue // an unknown domain limits nothing, even with an override
		}
		entries := make([]policy.Entry, len(d.GetEntries()))
		for j, e := range d.GetEntries() {
			entries[j] = policy.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		as[i].entries = entries
		if o := d.GetLimit(); o != nil {
			u := policy.Unit(o.GetUnit())
			switch {
			case u.Period() == 0:
				return nil, fmt.Errorf("descriptors[%d].limit.unit: %v is not a unit", i, o.GetUnit())
			case o.GetRequestsPerUnit() > policy.MaxRequestsPerUnit:
				return nil, fmt.Errorf("descriptors[%d].limit.requests_per_unit: %d, at most %d allowed", i, o.GetRequestsPerUnit(), policy.MaxRequestsPerUnit)
			}
			// An override is a plain fixed window: no shadow mode, no name.
			as[i].limit = &policy.Limit{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: u, Algorithm: limiter.FixedWindow}
			continue
		}
		m := set.Match(domain, entries)
		if m.Limit == nil {
			continue
		}
		for _, r := range m.Limit.Replaces {
			replaced[r] = true
		}
		if m.Limit.Unlimited {
			as[i].unlimited = true
			continue
		}
		as[i].limit, as[i].shared = m.Limit, m.Shared
	}
	for i := range as {
		if l := as[i].limit; l != nil && l.Name != "" && replaced[l.Name] {
			as[i].limit = nil
		}
	}
	return as, nil
}

// checkItem is the ringlimit check of descriptor d under a.limit.
func checkItem(domain string, a *applied) *pb.CheckItem {
	l := a.limit
	hits := a.hits
	return &pb.CheckItem{
		// The window is part of the name, so that a limit whose unit (or
		// multiplier) changes starts a new counter, as envoyproxy/ratelimit's
		// keys do.
		Name: "rls/" + l.WindowName(),
		Key:  CounterKey(domain, a.entries, a.shared),
		Hits: &hits,
		// A limit of 0 is checked as 1: over is then "count after > 0",
		// which answer reads off remaining.
		Limit:         max(l.Enforced(), 1),
		DurationMs:    l.Window().Milliseconds(),
		Algorithm:     pb.Algorithm(l.Algorithm),
		MinIntervalMs: l.MinInterval.Milliseconds(),
		ChargeRefused: chargesRefused(l),
		Ceiling:       int64(l.Ceiling),
		Parent:        parentOf(l),
	}
}

// chargesRefused reports whether checks under l count refused hits, as
// envoyproxy/ratelimit's fixed window does: those of our fixed window
// with neither a spacing nor a ceiling, whose refusals are never counted.
func chargesRefused(l *policy.Limit) bool {
	return l.Algorithm == limiter.FixedWindow && l.MinInterval == 0 && l.Ceiling == 0
}

// parentOf is the parent of a check under l, nil if l has no ceiling.
func parentOf(l *policy.Limit) *pb.ParentLimit {
	if l.Ceiling == 0 {
		return nil
	}
	return &pb.ParentLimit{Key: l.Parent.Key, Limit: int64(l.Parent.RequestsPerUnit), DurationMs: l.Parent.Window().Milliseconds()}
}

// CounterKey is envoyproxy/ratelimit's cache key without its window:
// domain_key_value_key_value_, with share_threshold values replaced by
// their wildcard (shared, from policy.Match). Package rlqs keys a
// bucket's counter by it too.
func CounterKey(domain string, entries []policy.Entry, shared []string) string {
	var b strings.Builder
	b.WriteString(domain)
	b.WriteByte('_')
	for i, e := range entries {
		v := e.Value
		if i < len(shared) && shared[i] != "" {
			v = shared[i]
		}
		b.WriteString(e.Key)
		b.WriteByte('_')
		b.WriteString(v)
		b.WriteByte('_')
	}
	if b.Len() <= maxKeyLen {
		return b.String()
	}
	sum := sha256.Sum256([]byte(b.String()))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// answer builds the response from the check's results.
func (s *Server) answer(as []applied, results []*pb.CheckResult) (*rlspb.RateLimitResponse, error) {
	nowMs := s.now().UnixMilli()
	resp := &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK,
		Statuses: make([]*rlspb.RateLimitResponse_DescriptorStatus, len(as))}
	failed, quota, failedQuota := 0, 0, 0
	for i, a := range as {
		st := &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}
		resp.Statuses[i] = st
		switch {
		case a.unlimited:
			st.LimitRemaining = math.MaxUint32
			continue
		case a.limit == nil:
			continue
		}
		r := results[a.item]
		if r.GetError() != "" {
			return nil, status.Errorf(checks.ItemStatus(r.GetErrorCode()), "descriptors[%d]: %s", i, r.GetError())
		}
		l := a.limit
		// A check of 0 hits (a peek) is always admitted; under the fixed
		// window it is over when the count is beyond the limit, and under
		// our other algorithms when a check of 1 would be refused.
		over := r.GetStatus() == pb.Status_OVER_LIMIT || l.RequestsPerUnit == 0 && r.GetRemaining() == 0 ||
			a.hits == 0 && !chargesRefused(l) && r.GetRemaining() == 0
		st.CurrentLimit = &rlspb.RateLimitResponse_RateLimit{Name: l.Name, RequestsPerUnit: uint32(l.Enforced()),
			Unit: rlspb.RateLimitResponse_RateLimit_Unit(l.Unit)}
		if l.UnitMultiplier > 1 {
			st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(l.UnitMultiplier)
		}
		if !over && l.RequestsPerUnit > 0 {
			st.LimitRemaining = uint32(min(r.GetRemaining(), math.MaxUint32))
		}
		// Windows end on whole seconds, so rounding up to the second is
		// envoyproxy/ratelimit's unit - now%unit.
		left := max(r.GetResetTimeMs()-nowMs, 0)
		st.DurationUntilReset = &durationpb.Duration{Seconds: (left + 999) / 1000}
		if over {
			st.Code = rlspb.RateLimitResponse_OVER_LIMIT
			if l.ShadowMode {
				st.Code = rlspb.RateLimitResponse_OK
			}
		}
		if l.QuotaMode {
			quota++
		}
		if st.Code == rlspb.RateLimitResponse_OVER_LIMIT {
			if l.QuotaMode {
				failedQuota++
			} else {
				failed++
			}
		}
	}
	if failed > 0 || quota > 0 && failedQuota == quota {
		resp.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT
	}
	return resp, nil
}
