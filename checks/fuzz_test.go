package checks

import (
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// skew is the clock skew the tests allow: --max-clock-skew's default.
const skew = 10 * time.Minute

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
		r, err := Request(item, t0, skew)
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
		case r.Name == "" || len(r.Name) > limiter.MaxNameLen, r.Key == "" || len(r.Key) > limiter.MaxKeyLen:
			t.Fatalf("accepted name/key of %d/%d bytes", len(r.Name), len(r.Key))
		case r.Limit.Count < 1 || r.Limit.Count > MaxLimit, r.Limit.Burst < 0 || r.Limit.Burst > MaxLimit:
			t.Fatalf("accepted limit %+v", r.Limit)
		case r.Limit.Period <= 0 || r.Limit.Period > MaxDuration:
			t.Fatalf("accepted period %v", r.Limit.Period)
		case r.Hits < 0 || r.Hits > MaxLimit:
			t.Fatalf("accepted hits %d", r.Hits)
		case r.Now.Sub(t0).Abs() > skew, r.Now.After(t0):
			t.Fatalf("accepted time %v, %v from the clock (never ahead of it)", r.Now, r.Now.Sub(t0))
		case !r.Algorithm.Valid():
			t.Fatalf("accepted algorithm %v", r.Algorithm)
		}
		// What a check makes, a node takes in: its counter passes the
		// intake's validation.
		c := limiter.Counter{Name: r.Name, Key: r.Key, Algorithm: r.Algorithm, Limit: r.Limit}
		if err := ValidateCounter(&c); err != nil {
			t.Fatalf("accepted a check whose counter %+v no node would take in: %v", c, err)
		}
	})
}
