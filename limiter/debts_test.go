package limiter

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// TestRestoredDebtNeverForgives: a counter evicted owing and restored from
// its debt (the instant it is full again) admits at no later instant what
// the counter itself would have refused, for every algorithm, and the
// buckets and GCRA, whose state is that instant, answer exactly as the
// counter would.
func TestRestoredDebtNeverForgives(t *testing.T) {
	l := algorithms.Limit{Count: 10, Period: time.Minute, Burst: 10}
	for a := range NumAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			for _, spent := range []int64{1, 4, 10} {
				s := New(Config{MaxKeys: 1})
				own := Request{Name: "api", Key: "user", Algorithm: a, Hits: spent, Now: t0.Add(7 * time.Second), Limit: l}
				if a == Spacing {
					own.Limit, own.Hits = SpacingLimit(6*time.Second), 1
				}
				s.Decide(&own)
				sh := s.shard(own.Key)
				tb := sh.tables[a]
				id, hash := sh.counterID(&own)
				until := tb.(interface{ fullAt(int32) int64 }).fullAt(tb.find(id, hash))
				other := own // evicts own, owing, to make room
				other.Key, other.Hits = "other", 0
				s.Decide(&other)
				if s.debtsHeld.Load() != 1 {
					t.Fatalf("spent %d: %d debts kept, want 1", spent, s.debtsHeld.Load())
				}
				exact := a == TokenBucket || a == GCRA || a == LeakyBucket
				orig := New(Config{}) // the counter, never evicted
				o := own
				orig.Decide(&o)
				for step := range 30 {
					at := own.Now.Add(time.Duration(step) * 3 * time.Second)
					for n := int64(1); n <= 10; n++ {
						peek := own
						peek.Hits, peek.Now = n, at
						if a == Spacing {
							peek.Hits = 1
						}
						restored := s.Check(&peek)
						want := orig.Check(&peek)
						if restored.Allowed && !want.Allowed || exact && restored.Allowed != want.Allowed {
							t.Fatalf("spent %d, %v later, %d hits: restored %+v, the counter's own %+v (full at %v)",
								spent, at.Sub(own.Now), n, restored, want, time.Duration(until-own.Now.UnixNano()))
						}
					}
				}
			}
		})
	}
}
