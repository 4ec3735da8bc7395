package service

import (
	"testing"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
)

// FuzzValidate feeds arbitrary items to the validator: it must never
// panic, and what it accepts must be within the documented bounds.
func FuzzValidate(f *testing.F) {
	f.Add("api", "user:42", int64(1), true, int64(10), int64(60000), int32(0), int64(0), int32(0), int64(0), int64(0))
	f.Add("", "", int64(-1), true, int64(0), int64(0), int32(9), int64(-1), int32(7), int64(-1), int64(-1))
	f.Add("n", "k", int64(0), false, int64(1e9), int64(31536000000), int32(5), int64(1e9), int32(2), t0.UnixMilli(), int64(31536000000))
	f.Add("n", "k", int64(3), true, int64(0), int64(0), int32(0), int64(0), int32(1), int64(0), int64(500))
	f.Add("n", "k", int64(3), true, int64(0), int64(0), int32(6), int64(0), int32(2), int64(0), int64(500))
	f.Fuzz(func(t *testing.T, name, key string, h int64, hasHits bool, limit, durMs int64, alg int32, burst int64, beh int32, created, minInterval int64) {
		item := &pb.CheckItem{Name: name, Key: key, Limit: limit, DurationMs: durMs, Algorithm: pb.Algorithm(alg),
			Burst: burst, Behavior: pb.Behavior(beh), CreatedAtMs: created, MinIntervalMs: minInterval}
		if hasHits {
			item.Hits = &h
		}
		r, err := toRequest(item, t0, DefaultMaxClockSkew)
		if err != nil {
			return
		}
		if r.Algorithm == limiter.Spacing { // a spacing alone: one request an interval, a check could ask for
			if r.Limit != limiter.SpacingLimit(r.Limit.Period) || r.MinInterval != 0 {
				t.Fatalf("accepted a spacing alone of limit %+v and interval %v", r.Limit, r.MinInterval)
			}
		}
		switch {
		case r.MinInterval < 0 || r.MinInterval > MaxDuration:
			t.Fatalf("accepted min interval %v", r.MinInterval)
		case (r.MinInterval > 0 || r.Algorithm == limiter.Spacing) && item.Behavior == pb.Behavior_GLOBAL:
			t.Fatalf("accepted a GLOBAL spacing")
		case r.Name == "" || len(r.Name) > MaxNameLen, r.Key == "" || len(r.Key) > MaxKeyLen:
			t.Fatalf("accepted name/key of %d/%d bytes", len(r.Name), len(r.Key))
		case r.Limit.Count < 1 || r.Limit.Count > MaxLimit, r.Limit.Burst < 0 || r.Limit.Burst > MaxLimit:
			t.Fatalf("accepted limit %+v", r.Limit)
		case r.Limit.Period <= 0 || r.Limit.Period > MaxDuration:
			t.Fatalf("accepted period %v", r.Limit.Period)
		case r.Hits < 0 || r.Hits > MaxLimit:
			t.Fatalf("accepted hits %d", r.Hits)
		case r.Now.Sub(t0).Abs() > DefaultMaxClockSkew:
			t.Fatalf("accepted time %v, %v from the clock", r.Now, r.Now.Sub(t0))
		case !r.Algorithm.Valid():
			t.Fatalf("accepted algorithm %v", r.Algorithm)
		}
	})
}

// FuzzBorrowing feeds arbitrary ceilings and parents to the validator: it
// must never panic, and a check it accepts borrows through a ceiling
// counter and a parent that are each a counter a check could make (so
// that a node hands them off and takes them in like any other), with a
// ceiling above the limit, and never with GLOBAL.
func FuzzBorrowing(f *testing.F) {
	f.Add(int64(10), int64(60000), int32(0), int64(0), int32(0), int64(0), int64(30), "all", int64(100), int64(0), true)
	f.Add(int64(10), int64(60000), int32(5), int64(0), int32(3), int64(0), int64(10_001), "all", int64(10_001), int64(-1), true)
	f.Add(int64(0), int64(0), int32(0), int64(0), int32(0), int64(1000), int64(30), "", int64(0), int64(31536000001), false)
	f.Add(int64(10), int64(1000), int32(2), int64(50), int32(2), int64(0), int64(20), "p", int64(1e9), int64(31536000000), true)
	svc := New(Config{})
	f.Fuzz(func(t *testing.T, limit, durMs int64, alg int32, burst int64, beh int32, minInterval, ceiling int64,
		parentKey string, parentLimit, parentDurMs int64, hasParent bool) {
		item := &pb.CheckItem{Name: "api", Key: "k", Limit: limit, DurationMs: durMs, Algorithm: pb.Algorithm(alg),
			Burst: burst, Behavior: pb.Behavior(beh), MinIntervalMs: minInterval, Ceiling: ceiling}
		if hasParent {
			item.Parent = &pb.ParentLimit{Key: parentKey, Limit: parentLimit, DurationMs: parentDurMs}
		}
		r, err := toRequest(item, t0, DefaultMaxClockSkew)
		if err != nil {
			return
		}
		b := borrowingOf(item, &r)
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
		case b.ceiling.Limit.Count <= r.Limit.Count:
			t.Fatalf("accepted ceiling %d, not above the limit %d", b.ceiling.Limit.Count, r.Limit.Count)
		case b.ceiling.Role != limiter.RoleCeiling || b.parent.Role != limiter.RoleLimit:
			t.Fatalf("roles %v and %v", b.ceiling.Role, b.parent.Role)
		}
		for _, c := range []limiter.Request{b.ceiling, b.parent} {
			counter := limiter.Counter{Name: c.Name, Key: c.Key, Algorithm: c.Algorithm, Role: c.Role, Limit: c.Limit}
			if err := svc.validateCounter(&counter); err != nil {
				t.Fatalf("accepted a check whose counter %+v no node would take: %v", counter, err)
			}
		}
		if _, err := toRequest(b.parentItem, t0, DefaultMaxClockSkew); err != nil {
			t.Fatalf("accepted a check whose parent's check %v its owner refuses: %v", b.parentItem, err)
		}
	})
}
