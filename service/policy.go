package service

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/policy"
)

// Policies is what the service needs of the policy files: package
// policy's Reloader.
type Policies interface {
	Resolve(ref string) (*policy.Limit, error)
}

// withPolicy returns item itself when it names no policy, else a copy
// with the policy's limit, duration_ms, algorithm, min_interval_ms,
// ceiling, parent and reserve_ttl_ms filled in (and the policy cleared), so that a
// forwarded check carries what this node resolved.
func (s *Service) withPolicy(item *pb.CheckItem) (*pb.CheckItem, error) {
	ref := item.GetPolicy()
	if ref == "" || s.policies == nil {
		return item, nil // checks.Request reports a policy without policies
	}
	switch {
	case item.Limit != 0:
		return item, &checks.FieldError{Field: "limit", Reason: "must be omitted when policy is set"}
	case item.DurationMs != 0:
		return item, &checks.FieldError{Field: "duration_ms", Reason: "must be omitted when policy is set"}
	case item.Algorithm != pb.Algorithm_TOKEN_BUCKET:
		return item, &checks.FieldError{Field: "algorithm", Reason: "must be omitted when policy is set: the policy names it"}
	case item.MinIntervalMs != 0:
		return item, &checks.FieldError{Field: "min_interval_ms", Reason: "must be omitted when policy is set: the policy names it"}
	case item.Ceiling != 0:
		return item, &checks.FieldError{Field: "ceiling", Reason: "must be omitted when policy is set: the policy names it"}
	case item.Parent != nil:
		return item, &checks.FieldError{Field: "parent", Reason: "must be omitted when policy is set: the policy names it"}
	}
	l, err := s.policies.Resolve(ref)
	switch {
	case err != nil:
		return item, &checks.FieldError{Field: "policy", Reason: err.Error()}
	case l.Unlimited:
		return item, &checks.FieldError{Field: "policy", Reason: fmt.Sprintf("%q is unlimited, which only Envoy's rate limit service applies", ref)}
	case l.RequestsPerUnit == 0:
		return item, &checks.FieldError{Field: "policy", Reason: fmt.Sprintf("%q has requests_per_unit 0: every hit is refused", ref)}
	}
	out := proto.CloneOf(item)
	out.Policy = ""
	out.Limit = l.Enforced()
	out.DurationMs = l.Window().Milliseconds()
	out.Algorithm = pb.Algorithm(l.Algorithm)
	out.MinIntervalMs = l.MinInterval.Milliseconds()
	if l.Ceiling > 0 {
		out.Ceiling = int64(l.Ceiling)
		out.Parent = &pb.ParentLimit{Key: l.Parent.Key, Limit: int64(l.Parent.RequestsPerUnit), DurationMs: l.Parent.Window().Milliseconds()}
	}
	if out.Name == "" {
		out.Name = ref
	}
	// A policy whose costs are known afterwards makes its checks reserve,
	// for its time-to-live unless the check asks for its own; a peek (0
	// hits) holds nothing and stays a peek.
	peek := out.Hits != nil && *out.Hits == 0
	if l.ReserveTTL > 0 && out.ReserveTtlMs == nil && !peek {
		ms := l.ReserveTTL.Milliseconds()
		out.ReserveTtlMs = &ms
	}
	return out, checks.CheckClientReserveTTL(out, l.ReserveTTL)
}
