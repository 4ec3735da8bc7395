package service

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/policy"
)

// Policies is what the service needs of the policy files: package
// policy's Reloader.
type Policies interface {
	Resolve(ref string) (*policy.Limit, error)
}

// withPolicy returns item itself when it names no policy, else a copy
// with the policy's limit, duration_ms, algorithm, min_interval_ms,
// ceiling and parent filled in (and the policy cleared), so that a
// forwarded check carries what this node resolved.
func (s *Service) withPolicy(item *pb.CheckItem) (*pb.CheckItem, error) {
	ref := item.GetPolicy()
	if ref == "" || s.policies == nil {
		return item, nil // toRequest reports a policy without policies
	}
	switch {
	case item.Limit != 0:
		return item, &FieldError{"limit", "must be omitted when policy is set"}
	case item.DurationMs != 0:
		return item, &FieldError{"duration_ms", "must be omitted when policy is set"}
	case item.Algorithm != pb.Algorithm_TOKEN_BUCKET:
		return item, &FieldError{"algorithm", "must be omitted when policy is set: the policy names it"}
	case item.MinIntervalMs != 0:
		return item, &FieldError{"min_interval_ms", "must be omitted when policy is set: the policy names it"}
	case item.Ceiling != 0:
		return item, &FieldError{"ceiling", "must be omitted when policy is set: the policy names it"}
	case item.Parent != nil:
		return item, &FieldError{"parent", "must be omitted when policy is set: the policy names it"}
	}
	l, err := s.policies.Resolve(ref)
	switch {
	case err != nil:
		return item, &FieldError{"policy", err.Error()}
	case l.Unlimited:
		return item, &FieldError{"policy", fmt.Sprintf("%q is unlimited, which only Envoy's rate limit service applies", ref)}
	case l.RequestsPerUnit == 0:
		return item, &FieldError{"policy", fmt.Sprintf("%q has requests_per_unit 0: every hit is refused", ref)}
	}
	out := proto.CloneOf(item)
	out.Policy = ""
	out.Limit = l.Enforced()
	out.DurationMs = l.Unit.Period().Milliseconds()
	out.Algorithm = pb.Algorithm(l.Algorithm)
	out.MinIntervalMs = l.MinInterval.Milliseconds()
	if l.Ceiling > 0 {
		out.Ceiling = int64(l.Ceiling)
		out.Parent = &pb.ParentLimit{Key: l.Parent.Key, Limit: int64(l.Parent.RequestsPerUnit), DurationMs: l.Parent.Unit.Period().Milliseconds()}
	}
	if out.Name == "" {
		out.Name = ref
	}
	return out, nil
}
