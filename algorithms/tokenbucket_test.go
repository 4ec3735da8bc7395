package algorithms_test

import (
	"math"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/ringlimit/ringlimit/algorithms"
)

// bucketCases are timelines that TokenBucket and GCRA must both follow.
var bucketCases = []struct {
	name  string
	limit algorithms.Limit
	steps []step
	// float marks a timeline on the edge where x/time/rate, computing in
	// float64, rounds a different way from the exact arithmetic.
	float bool
}{
	{
		// A burst, then one per emission interval.
		name:  "burst then one per interval",
		limit: algorithms.Limit{Count: 2, Period: time.Second},
		steps: []step{
			{0, 0, ok(2, 0)}, // a peek at a full bucket
			{0, 1, ok(1, 500*time.Millisecond)},
			{0, 1, ok(0, time.Second)},
			{0, 1, no(0, 500*time.Millisecond, time.Second)},
			{499 * time.Millisecond, 1, no(0, time.Millisecond, 501*time.Millisecond)},
			{500 * time.Millisecond, 1, ok(0, time.Second)},
			{750 * time.Millisecond, 1, no(0, 250*time.Millisecond, 750*time.Millisecond)},
			{1000 * time.Millisecond, 1, ok(0, time.Second)},
			{3000 * time.Millisecond, 0, ok(2, 0)},
			{3000 * time.Millisecond, 3, no(2, algorithms.Never, 0)},
			{3000 * time.Millisecond, 2, ok(0, time.Second)},
		},
	},
	{
		name:  "burst above rate",
		limit: algorithms.Limit{Count: 10, Period: time.Second, Burst: 3},
		steps: []step{
			{0, 3, ok(0, 300*time.Millisecond)},
			{0, 1, no(0, 100*time.Millisecond, 300*time.Millisecond)},
			{250 * time.Millisecond, 2, ok(0, 250*time.Millisecond)},
			{250 * time.Millisecond, 1, no(0, 50*time.Millisecond, 250*time.Millisecond)},
		},
	},
	{
		// The emission interval 1s/3 is 333333333⅓ ns. x/time/rate admits
		// a shortfall under 1 ns, so three takes 333333333 ns apart pass,
		// each a third of a nanosecond short, and the fourth is refused 1 ns
		// early: the remainders add up exactly, with no drift. x/time/rate
		// rounds the fourth take's 1 ns wait down to 0.99… ns and admits it.
		name:  "sub-nanosecond interval",
		float: true,
		limit: algorithms.Limit{Count: 3, Period: time.Second, Burst: 1},
		steps: []step{
			{0, 1, ok(0, 333333334)},
			{333333333, 1, ok(0, 333333334)},
			{666666666, 1, ok(0, 333333334)},
			{999999999, 1, no(0, 1, 1)},
			{1000000000, 1, ok(0, 333333334)},
		},
	},
}

func TestTokenBucketTimeline(t *testing.T) {
	for _, tc := range bucketCases {
		t.Run(tc.name, func(t *testing.T) {
			runTimeline(t, new(algorithms.TokenBucket), tc.limit, tc.steps)
		})
	}
}

func TestGCRATimeline(t *testing.T) {
	for _, tc := range bucketCases {
		t.Run(tc.name, func(t *testing.T) {
			runTimeline(t, new(algorithms.GCRA), tc.limit, tc.steps)
		})
	}
}

// TestBucketTimelinesMatchRate checks the timelines' verdicts against
// x/time/rate itself.
func TestBucketTimelinesMatchRate(t *testing.T) {
	for _, tc := range bucketCases {
		if tc.float {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			l := tc.limit
			lim := rate.NewLimiter(rate.Limit(float64(l.Count)/l.Period.Seconds()), int(l.Capacity()))
			for i, s := range tc.steps {
				if got := lim.AllowN(t0.Add(s.at), int(s.n)); got != s.want.Allowed {
					t.Errorf("step %d: rate AllowN = %v, want %v", i, got, s.want.Allowed)
				}
			}
		})
	}
}

// TestBucketLargeLimits checks that limits near the top of the range
// (Count and Burst 1e9, Period a year) neither overflow nor lose
// precision, and that an instant past 2262 is refused rather than wrapped.
func TestBucketLargeLimits(t *testing.T) {
	year := 365 * 24 * time.Hour
	interval := year / 1e9 // 31.536 ms, exactly
	for _, k := range kinds()[:3] {
		t.Run(k.name, func(t *testing.T) {
			l := algorithms.Limit{Count: 1e9, Period: year}
			c := k.new()
			if d := c.Take(t0, l, 1e9); !d.Allowed || d.Remaining != 0 || d.ResetAfter != year {
				t.Fatalf("Take(1e9) = %+v, want admitted, 0 remaining, reset after a year", d)
			}
			d := c.Take(t0, l, 1)
			if d.Allowed || d.RetryAfter != interval {
				t.Fatalf("Take(1) = %+v, want refused, retry after %v", d, interval)
			}
			if d := c.Take(t0.Add(interval), l, 1); !d.Allowed {
				t.Fatalf("Take(1) after one interval = %+v, want admitted", d)
			}

			// A billion hits at one per year would end in the year 1e9.
			slow := algorithms.Limit{Count: 1, Period: year, Burst: 1e9}
			c = k.new()
			if d := c.Take(t0, slow, 1e9); d.Allowed || d.RetryAfter != algorithms.Never {
				t.Errorf("Take(1e9) at 1/year = %+v, want refused with Never", d)
			}
			if d := c.Take(t0, slow, 100); !d.Allowed || d.Remaining != 1e9-100 {
				t.Errorf("Take(100) at 1/year = %+v, want admitted", d)
			}
			if d := c.Check(t0, slow, 0); d.ResetAfter != 100*year {
				t.Errorf("ResetAfter = %v, want %v", d.ResetAfter, 100*year)
			}
			huge := algorithms.Limit{Count: math.MaxInt64, Period: math.MaxInt64, Burst: math.MaxInt64}
			if d := k.new().Take(t0, huge, math.MaxInt64); d.Allowed || d.RetryAfter != algorithms.Never {
				t.Errorf("Take(MaxInt64) = %+v, want refused with Never", d)
			}
		})
	}
}
