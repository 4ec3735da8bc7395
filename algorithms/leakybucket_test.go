package algorithms_test

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// queued builds the decision of an admitted LeakyBucket request.
func queued(delay time.Duration, remaining int64, reset time.Duration) algorithms.Decision {
	return algorithms.Decision{Allowed: true, Delay: delay, Remaining: remaining, ResetAfter: reset}
}

func TestLeakyBucketTimeline(t *testing.T) {
	ms := time.Millisecond
	// 10 per second with room for 5: five requests at once are queued
	// 100 ms apart, the sixth does not fit.
	l := algorithms.Limit{Count: 10, Period: time.Second, Burst: 5}
	runTimeline(t, new(algorithms.LeakyBucket), l, []step{
		{0, 1, queued(0, 4, 100*ms)},
		{0, 1, queued(100*ms, 3, 200*ms)},
		{0, 1, queued(200*ms, 2, 300*ms)},
		{0, 1, queued(300*ms, 1, 400*ms)},
		{0, 1, queued(400*ms, 0, 500*ms)},
		{0, 1, no(0, 100*ms, 500*ms)},
		{0, 6, no(0, algorithms.Never, 500*ms)},
		{100 * ms, 1, queued(400*ms, 0, 500*ms)},
		{150 * ms, 1, no(0, 50*ms, 450*ms)},
		{200 * ms, 1, queued(400*ms, 0, 500*ms)},
		{700 * ms, 2, queued(0, 3, 200*ms)},
		{2000 * ms, 0, queued(0, 5, 0)},
	})
}

// TestLeakyBucketSpacing checks that callers who wait their Delay proceed
// exactly one emission interval apart, even when it is not a whole number
// of nanoseconds: 3 per second start at 0, 333333334 and 666666667 ns
// (each rounded up, never early), and the next one 1 s after the first.
func TestLeakyBucketSpacing(t *testing.T) {
	l := algorithms.Limit{Count: 3, Period: time.Second}
	var q algorithms.LeakyBucket
	var starts []time.Duration
	for range 4 {
		d := q.Take(t0, l, 1)
		if !d.Allowed {
			break
		}
		starts = append(starts, d.Delay)
	}
	want := []time.Duration{0, 333333334, 666666667}
	if len(starts) != len(want) || starts[0] != want[0] || starts[1] != want[1] || starts[2] != want[2] {
		t.Fatalf("delays %v, want %v", starts, want)
	}
	// The queue drains at exactly 1 s. At 333333333 ns a fourth request
	// would end a third of a nanosecond past the capacity, so it must wait
	// 1 ns; then it starts exactly 1 s after the first.
	if d := q.Take(t0.Add(333333333), l, 1); d.Allowed || d.RetryAfter != 1 {
		t.Errorf("at 333333333ns: %+v, want refused for 1ns", d)
	}
	if d := q.Take(t0.Add(333333334), l, 1); !d.Allowed || d.Delay != 666666666 {
		t.Errorf("at 333333334ns: %+v, want admitted with Delay 666666666ns (start at 1s)", d)
	}
}
