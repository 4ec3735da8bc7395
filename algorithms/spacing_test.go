package algorithms_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// TestSpacing plays timelines against t0: one request per Period, however
// many hits it carries; a refusal waits exactly until the Period is up.
func TestSpacing(t *testing.T) {
	const ms = time.Millisecond
	second := algorithms.Limit{Count: 1, Period: time.Second}
	for _, tc := range []struct {
		name  string
		limit algorithms.Limit
		steps []step
	}{
		{
			name:  "one request a period",
			limit: second,
			steps: []step{
				{0, 0, ok(1, 0)}, // a peek at rest
				{0, 1, ok(0, time.Second)},
				{0, 0, ok(0, time.Second)}, // a peek charges nothing
				{0, 1, no(0, time.Second, time.Second)},
				{999 * ms, 1, no(0, ms, ms)},
				{time.Second - 1, 1, no(0, 1, 1)}, // a nanosecond early
				{time.Second, 1, ok(0, time.Second)},
				{1500 * ms, 1, no(0, 500*ms, 500*ms)},
				{5 * time.Second, 0, ok(1, 0)},
				{5 * time.Second, 1, ok(0, time.Second)},
			},
		},
		{
			name:  "hits do not matter: a request is one request",
			limit: second,
			steps: []step{
				{0, 1_000_000, ok(0, time.Second)},
				{time.Second, 7, ok(0, time.Second)},
				{1999 * ms, 1, no(0, ms, ms)},
			},
		},
		{
			name:  "the period counts from the admitted request, not the refused ones",
			limit: algorithms.Limit{Count: 1, Period: 100 * ms},
			steps: []step{
				{0, 1, ok(0, 100*ms)},
				{50 * ms, 1, no(0, 50*ms, 50*ms)},
				{99 * ms, 1, no(0, ms, ms)},
				{100 * ms, 1, ok(0, 100*ms)},
				{250 * ms, 1, ok(0, 100*ms)},
			},
		},
		{
			name:  "count and burst are not read",
			limit: algorithms.Limit{Count: 50, Period: time.Second, Burst: 9},
			steps: []step{
				{0, 1, ok(0, time.Second)},
				{0, 1, no(0, time.Second, time.Second)},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runTimeline(t, new(algorithms.Spacing), tc.limit, tc.steps)
		})
	}
}

// TestSpacingIsGCRA is Spacing's differential test: on random timelines
// of requests of 0 and 1 hits under a random Period, it decides exactly as
// GCRA does with one cell per Period and a burst of 1, and its Next is
// that GCRA's TAT (both at rest alike when not after now: a GCRA peek
// moves a past TAT up to now).
func TestSpacingIsGCRA(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for i := range 2000 {
		period := time.Duration(1 + rng.Int64N(int64(time.Hour)))
		l := algorithms.Limit{Count: 1, Period: period, Burst: 1}
		var s algorithms.Spacing
		var g algorithms.GCRA
		now := t0
		for j := range 50 {
			if rng.IntN(5) > 0 {
				now = now.Add(time.Duration(rng.Int64N(int64(2 * period))))
			}
			n := rng.Int64N(2)
			want, got := g.Take(now, l, n), s.Take(now, l, n)
			if got != want {
				t.Fatalf("timeline %d (period %v) step %d (%v, n=%d): Spacing = %+v, GCRA = %+v", i, period, j, now.Sub(t0), n, got, want)
			}
			if ns := now.UnixNano(); max(s.Next, ns) != max(g.TAT, ns) || g.TATFrac != 0 {
				t.Fatalf("timeline %d step %d: Spacing.Next %d, GCRA TAT %d+%d", i, j, s.Next, g.TAT, g.TATFrac)
			}
		}
	}
}

// TestSpacingEdges: a clock going back waits as long as ever, and a Next
// past 2262 is refused with Never rather than saturated.
func TestSpacingEdges(t *testing.T) {
	l := algorithms.Limit{Count: 1, Period: time.Minute}
	var s algorithms.Spacing
	s.Take(t0, l, 1)
	if d := s.Take(t0.Add(-time.Hour), l, 1); d.Allowed || d.RetryAfter != time.Hour+time.Minute {
		t.Errorf("an hour back: %+v, want refused for an hour and a minute", d)
	}
	end := time.Unix(0, math.MaxInt64-int64(time.Second))
	if d := new(algorithms.Spacing).Take(end, l, 1); d.Allowed || d.RetryAfter != algorithms.Never {
		t.Errorf("a minute before 2262 ends: %+v, want refused with Never", d)
	}
}

func TestMergeSpacing(t *testing.T) {
	l := algorithms.Limit{Count: 1, Period: time.Second}
	var more, less algorithms.Spacing
	less.Take(t0, l, 1)
	more.Take(t0.Add(time.Millisecond), l, 1)
	testMerge(t, more, less, func(a *algorithms.Spacing, b algorithms.Spacing) { a.Merge(b) })
}

// TestClampSpacing: a Next set under a longer period is brought to one
// new period from now; one within it is unchanged.
func TestClampSpacing(t *testing.T) {
	ns := t0.UnixNano()
	second := algorithms.Limit{Count: 1, Period: time.Second}
	for _, tc := range []struct {
		name     string
		next     int64
		l        algorithms.Limit
		want     int64
		decision algorithms.Decision // of a request right after the clamp
	}{
		{"a day ahead waits a second", ns + int64(24*time.Hour), second, ns + int64(time.Second), no(0, time.Second, time.Second)},
		{"within the period is unchanged", ns + int64(300*time.Millisecond), second, ns + int64(300*time.Millisecond),
			no(0, 300*time.Millisecond, 300*time.Millisecond)},
		{"negative is at rest", -5, second, 0, ok(0, time.Second)},
		{"an invalid limit changes nothing", ns + int64(time.Hour), algorithms.Limit{Period: time.Second}, ns + int64(time.Hour),
			algorithms.Decision{RetryAfter: algorithms.Never}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := algorithms.Spacing{Next: tc.next}
			s.Clamp(t0, tc.l)
			if s.Next != tc.want {
				t.Fatalf("Clamp: Next %d, want %d", s.Next, tc.want)
			}
			if d := s.Take(t0, tc.l, 1); d != tc.decision {
				t.Errorf("then Take = %+v, want %+v", d, tc.decision)
			}
		})
	}
}

// A minimum spacing admits one request per Period, and says exactly how
// long to wait.
func ExampleSpacing_Take() {
	l := algorithms.Limit{Count: 1, Period: time.Second}
	var s algorithms.Spacing
	start := time.Unix(0, 0)
	for _, at := range []time.Duration{0, 400 * time.Millisecond, time.Second, time.Second} {
		d := s.Take(start.Add(at), l, 1)
		fmt.Printf("%v: allowed %v, retry after %v\n", at, d.Allowed, d.RetryAfter)
	}
	// Output:
	// 0s: allowed true, retry after 0s
	// 400ms: allowed false, retry after 600ms
	// 1s: allowed true, retry after 0s
	// 1s: allowed false, retry after 1s
}
