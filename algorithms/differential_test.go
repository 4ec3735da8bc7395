package algorithms_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/ringlimit/ringlimit/algorithms"
)

// randomTimeline is a random limit and a random sequence of requests at
// non-decreasing times.
type randomTimeline struct {
	limit algorithms.Limit
	at    []time.Duration // offsets from t0, non-decreasing
	n     []int64
}

// newRandomTimeline draws a timeline of steps requests: Count in [1, 1000],
// Period from 1ms to 1h, Burst 0 (meaning Count) or in [1, 1000], hits in
// [0, capacity+1], and gaps of up to about two requests' worth of refill,
// or none.
func newRandomTimeline(rng *rand.Rand, steps int) randomTimeline {
	l := algorithms.Limit{
		Count:  1 + rng.Int64N(1000),
		Period: time.Millisecond + time.Duration(rng.Int64N(int64(time.Hour-time.Millisecond))),
	}
	if rng.IntN(2) == 0 {
		l.Burst = 1 + rng.Int64N(1000)
	}
	b := l.Capacity()
	interval := max(l.Period/time.Duration(l.Count), 1)
	tl := randomTimeline{limit: l}
	var at time.Duration
	for range steps {
		n := rng.Int64N(b + 2)
		if rng.IntN(5) > 0 {
			at += time.Duration(rng.Int64N(int64(2*interval)*max(n, 1))) + 1
		}
		tl.at = append(tl.at, at)
		tl.n = append(tl.n, n)
	}
	return tl
}

// TestBucketsMatchRate is the differential test of the bucket algorithms:
// on thousands of random timelines, TokenBucket and GCRA admit exactly
// what x/time/rate's AllowN admits, and GCRA decides exactly as
// TokenBucket does.
func TestBucketsMatchRate(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	timelines, mismatches := 3000, 0
	if testing.Short() {
		timelines = 300
	}
	for i := range timelines {
		tl := newRandomTimeline(rng, 50)
		l := tl.limit
		lim := rate.NewLimiter(rate.Limit(float64(l.Count)/l.Period.Seconds()), int(l.Capacity()))
		var tb algorithms.TokenBucket
		var g algorithms.GCRA
		for j := range tl.at {
			now, n := t0.Add(tl.at[j]), tl.n[j]
			want := lim.AllowN(now, int(n))
			got := tb.Take(now, l, n)
			if gd := g.Take(now, l, n); gd != got {
				t.Fatalf("timeline %d (%+v) step %d: GCRA = %+v, TokenBucket = %+v", i, l, j, gd, got)
			}
			if got.Allowed != want {
				t.Errorf("timeline %d (%+v) step %d (t0+%v, n=%d): TokenBucket %+v, x/time/rate allowed = %v",
					i, l, j, tl.at[j], n, got, want)
				if mismatches++; mismatches > 5 {
					t.FailNow()
				}
				break
			}
		}
	}
}
