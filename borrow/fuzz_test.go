package borrow

import (
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/limiter"
)

// FuzzBorrowing feeds arbitrary ceilings and parents to the validator: it
// must never panic, and a check it accepts borrows through a ceiling
// counter and a parent that are each a counter a check could make (so
// that a node hands them off and takes them in like any other), with a
// ceiling above the limit, and never with GLOBAL.
func FuzzBorrowing(f *testing.F) {
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	const skew = 10 * time.Minute // the validator's bound on created_at_ms: any will do
	f.Add(int64(10), int64(60000), int32(0), int64(0), int32(0), int64(0), int64(30), "all", int64(100), int64(0), true)
	f.Add(int64(10), int64(60000), int32(5), int64(0), int32(3), int64(0), int64(10_001), "all", int64(10_001), int64(-1), true)
	f.Add(int64(0), int64(0), int32(0), int64(0), int32(0), int64(1000), int64(30), "", int64(0), int64(31536000001), false)
	f.Add(int64(10), int64(1000), int32(2), int64(50), int32(2), int64(0), int64(20), "p", int64(1e9), int64(31536000000), true)
	f.Fuzz(func(t *testing.T, limit, durMs int64, alg int32, burst int64, beh int32, minInterval, ceiling int64,
		parentKey string, parentLimit, parentDurMs int64, hasParent bool) {
		item := &pb.CheckItem{Name: "api", Key: "k", Limit: limit, DurationMs: durMs, Algorithm: pb.Algorithm(alg),
			Burst: burst, Behavior: pb.Behavior(beh), MinIntervalMs: minInterval, Ceiling: ceiling}
		if hasParent {
			item.Parent = &pb.ParentLimit{Key: parentKey, Limit: parentLimit, DurationMs: parentDurMs}
		}
		r, err := checks.Request(item, t0, skew)
		if err != nil {
			return
		}
		b := Of(item, &r)
		if b == nil {
			if ceiling != 0 || hasParent {
				t.Fatalf("accepted ceiling %d, parent %v, and borrows nothing", ceiling, item.Parent)
			}
			return
		}
		switch {
		case item.Behavior == pb.Behavior_GLOBAL:
			t.Fatal("accepted a GLOBAL check with a ceiling")
		case r.Algorithm == limiter.Spacing:
			t.Fatal("accepted a ceiling on a spacing alone")
		case b.Ceiling.Limit.Count <= r.Limit.Count:
			t.Fatalf("accepted ceiling %d, not above the limit %d", b.Ceiling.Limit.Count, r.Limit.Count)
		case b.Ceiling.Role != limiter.RoleCeiling || b.Parent.Role != limiter.RoleLimit:
			t.Fatalf("roles %v and %v", b.Ceiling.Role, b.Parent.Role)
		}
		for _, c := range []limiter.Request{b.Ceiling, b.Parent} {
			counter := limiter.Counter{Name: c.Name, Key: c.Key, Algorithm: c.Algorithm, Role: c.Role, Limit: c.Limit}
			if err := checks.ValidateCounter(&counter); err != nil {
				t.Fatalf("accepted a check whose counter %+v no node would take: %v", counter, err)
			}
		}
		if _, err := checks.Request(b.ParentItem, t0, skew); err != nil {
			t.Fatalf("accepted a check whose parent's check %v its owner refuses: %v", b.ParentItem, err)
		}
	})
}
