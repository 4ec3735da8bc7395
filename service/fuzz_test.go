package service

import (
	"testing"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// FuzzValidate feeds arbitrary items to the validator: it must never
// panic, and what it accepts must be within the documented bounds.
func FuzzValidate(f *testing.F) {
	f.Add("api", "user:42", int64(1), true, int64(10), int64(60000), int32(0), int64(0), int32(0), int64(0))
	f.Add("", "", int64(-1), true, int64(0), int64(0), int32(9), int64(-1), int32(7), int64(-1))
	f.Add("n", "k", int64(0), false, int64(1e9), int64(31536000000), int32(5), int64(1e9), int32(2), t0.UnixMilli())
	f.Fuzz(func(t *testing.T, name, key string, h int64, hasHits bool, limit, durMs int64, alg int32, burst int64, beh int32, created int64) {
		item := &pb.CheckItem{Name: name, Key: key, Limit: limit, DurationMs: durMs, Algorithm: pb.Algorithm(alg),
			Burst: burst, Behavior: pb.Behavior(beh), CreatedAtMs: created}
		if hasHits {
			item.Hits = &h
		}
		r, err := toRequest(item, t0, DefaultMaxClockSkew)
		if err != nil {
			return
		}
		switch {
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
