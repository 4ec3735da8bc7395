package service

import (
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// TestPoisonedLimit is issue 7's poisoned limit, through the public check:
// one check with limit 1 per 365 days and 1 hit on user:1, then the
// application's own 10 per minute on user:1. The counter follows the limit
// it is checked with, so the application's limit holds user:1 for at most
// one of its own minutes (a bucket is left exactly empty under it, a
// window starts afresh), never for the year the hostile check asked for.
func TestPoisonedLimit(t *testing.T) {
	for alg := range pb.Algorithm(len(pb.Algorithm_name)) {
		t.Run(alg.String(), func(t *testing.T) {
			now := t0
			s := New(Config{Now: func() time.Time { return now }})
			hostile := &pb.CheckItem{Name: "api", Key: "user:1", Algorithm: alg,
				Limit: 1, DurationMs: (365 * 24 * time.Hour).Milliseconds(), Hits: hits(1)}
			if r := check(t, s, hostile); r.Status != pb.Status_UNDER_LIMIT {
				t.Fatalf("hostile check: %v", r.Status)
			}
			app := &pb.CheckItem{Name: "api", Key: "user:1", Algorithm: alg,
				Limit: 10, DurationMs: time.Minute.Milliseconds(), Hits: hits(10)}
			// 10 at once now (a window starts afresh), or else (a bucket
			// left empty) after at most a minute.
			r := check(t, s, app)
			if r.Status != pb.Status_UNDER_LIMIT {
				if r.RetryAfterMs < 0 || r.RetryAfterMs > time.Minute.Milliseconds() {
					t.Fatalf("right after the hostile check, 10 of 10/minute told to retry after %d ms, want at most a minute", r.RetryAfterMs)
				}
				now = now.Add(time.Duration(r.RetryAfterMs) * time.Millisecond)
				r = check(t, s, app)
			}
			if r.Status != pb.Status_UNDER_LIMIT || r.Remaining != 0 {
				t.Fatalf("10 of 10/minute at t0+%v: %v with %d remaining, want all 10 admitted", now.Sub(t0), r.Status, r.Remaining)
			}
			one := &pb.CheckItem{Name: "api", Key: "user:1", Algorithm: alg, Limit: 10, DurationMs: time.Minute.Milliseconds()}
			if r := check(t, s, one); r.Status != pb.Status_OVER_LIMIT {
				t.Errorf("an 11th hit in the same minute: %v, want OVER_LIMIT: the new limit holds", r.Status)
			}
		})
	}
}
