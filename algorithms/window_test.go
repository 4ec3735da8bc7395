package algorithms_test

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// The worked example shared by the window algorithms: 3 per minute, with
// requests at 12:00:05, 12:00:15, 12:01:01, 12:01:10, 12:01:40, 12:01:50
// and 12:02:20 (t0 is 12:00:00).
var perMinute3 = algorithms.Limit{Count: 3, Period: time.Minute}

const s = time.Second

// TestFixedWindowTimeline: windows start at whole minutes, so the 12:01
// window admits 12:01:01, 12:01:10 and 12:01:40, refuses 12:01:50 until
// 12:02, and 12:02:20 opens a fresh window.
func TestFixedWindowTimeline(t *testing.T) {
	runTimeline(t, new(algorithms.FixedWindow), perMinute3, []step{
		{5 * s, 1, ok(2, 55*s)},
		{15 * s, 1, ok(1, 45*s)},
		{61 * s, 1, ok(2, 59*s)},
		{70 * s, 1, ok(1, 50*s)},
		{100 * s, 1, ok(0, 20*s)},
		{110 * s, 1, no(0, 10*s, 10*s)},
		{110 * s, 4, no(0, algorithms.Never, 10*s)},
		{140 * s, 1, ok(2, 40*s)},
		{140 * s, 0, ok(2, 40*s)},
	})
}

// TestSlidingLogTimeline: the log counts hits in (t-60s, t]. 12:01:01 sees
// 12:00:05 and 12:00:15, and 12:01:10 sees 12:00:15 and 12:01:01: both
// admitted. 12:01:40 sees 12:01:01 and 12:01:10: admitted. 12:01:50 sees
// three and must wait 11 s, until 12:01:01 leaves. 12:02:20 sees only
// 12:01:40.
func TestSlidingLogTimeline(t *testing.T) {
	runTimeline(t, new(algorithms.SlidingLog), perMinute3, []step{
		{5 * s, 1, ok(2, 60*s)},
		{15 * s, 1, ok(1, 60*s)},
		{61 * s, 1, ok(0, 60*s)},
		{70 * s, 1, ok(0, 60*s)},
		{100 * s, 1, ok(0, 60*s)},
		{110 * s, 1, no(0, 11*s, 50*s)},
		{110 * s, 4, no(0, algorithms.Never, 50*s)},
		{140 * s, 1, ok(1, 60*s)},
		{140 * s, 2, no(1, 20*s, 60*s)}, // until 12:01:40 leaves
		{200 * s, 2, ok(1, 60*s)},       // 12:02:20 has just left
	})
}

// TestSlidingWindowTimeline runs the same requests through the weighted
// estimate prev·(60s-elapsed)/60s + curr, which is stricter here: at
// 12:01:10 it is 2·50/60 + 1 ≈ 2.67, so one more would exceed 3 until
// 12:01:30, when 2·30/60 + 1 = 2.
func TestSlidingWindowTimeline(t *testing.T) {
	runTimeline(t, new(algorithms.SlidingWindow), perMinute3, []step{
		{5 * s, 1, ok(2, 115*s)},
		{15 * s, 1, ok(1, 105*s)},
		{61 * s, 1, ok(0, 119*s)}, // 2·59/60 + 1 + 1 ≈ 2.97
		{70 * s, 1, no(0, 20*s, 110*s)},
		{100 * s, 1, ok(0, 80*s)},       // 2·20/60 + 1 + 1 ≈ 2.67
		{110 * s, 1, no(0, 10*s, 70*s)}, // at 12:02:00, 2 + 0 + 1 = 3
		{140 * s, 1, ok(0, 100*s)},      // 2·40/60 + 0 + 1 ≈ 2.33
	})
}

// TestSlidingWindowExample is DESIGN.md's example: 100 per minute, with
// 100 hits in the first 15 s of a window. 15 s into the next window the
// estimate is 100·45/60 = 75, so exactly 25 more are admitted; 45 s into it
// it is 100·15/60 + 25 = 50, so 50 more, 75 in that window in all.
func TestSlidingWindowExample(t *testing.T) {
	l := algorithms.Limit{Count: 100, Period: time.Minute}
	var w algorithms.SlidingWindow
	for i := range 100 {
		if d := w.Take(t0.Add(time.Duration(i)*150*time.Millisecond), l, 1); !d.Allowed {
			t.Fatalf("hit %d in the first window refused: %+v", i, d)
		}
	}
	admit := func(at time.Duration) (n int64, refusal algorithms.Decision) {
		for {
			d := w.Take(t0.Add(at), l, 1)
			if !d.Allowed {
				return n, d
			}
			n++
		}
	}
	ms := time.Millisecond
	// After 25 more at 75 s: 100·(60-15.6)/60 + 25 + 1 = 100 at 75.6 s.
	if n, d := admit(75 * s); n != 25 || d != no(0, 600*ms, 105*s) {
		t.Errorf("15 s into the next window: admitted %d, then %+v; want 25, then retry after 600ms", n, d)
	}
	if n, d := admit(105 * s); n != 50 || d != no(0, 600*ms, 75*s) {
		t.Errorf("45 s into the next window: admitted %d, then %+v; want 50, then retry after 600ms", n, d)
	}
	if w.Curr != 75 || w.Prev != 100 {
		t.Errorf("state %+v, want 100 previous and 75 current", w)
	}
	// A full request must wait until the 75 have decayed entirely: the
	// end of the window after.
	if d := w.Check(t0.Add(105*s), l, 100); d.RetryAfter != 75*s {
		t.Errorf("RetryAfter for 100 = %v, want 75s", d.RetryAfter)
	}
}

// TestFixedWindowAdd: Add counts refused hits too (envoyproxy/ratelimit's
// rule: refused iff the count after adding exceeds the limit), so a
// client that keeps knocking stays refused, and a check of 0 hits after
// that reports the window over its limit.
func TestFixedWindowAdd(t *testing.T) {
	var w algorithms.FixedWindow
	steps := []step{
		{5 * s, 2, ok(1, 55*s)},
		{6 * s, 2, no(0, 54*s, 54*s)}, // count 4 > 3: refused, and counted
		{7 * s, 0, no(0, 53*s, 53*s)}, // 4 > 3 still: a peek is refused
		{8 * s, 4, no(0, algorithms.Never, 52*s)},
		{61 * s, 1, ok(2, 59*s)}, // a new window forgets the excess
		{62 * s, 0, ok(2, 58*s)},
	}
	for i, st := range steps {
		if got := w.Add(t0.Add(st.at), perMinute3, st.n); got != st.want {
			t.Errorf("step %d: Add(t0+%v, %d) = %+v, want %+v", i, st.at, st.n, got, st.want)
		}
	}
	if w.Count != 1 {
		t.Errorf("count = %d, want 1", w.Count)
	}
	before := w
	if d := w.Add(t0, algorithms.Limit{}, 1); d.Allowed || w != before {
		t.Errorf("invalid limit: %+v, state %+v", d, w)
	}
	if d := w.Add(t0.Add(62*s), perMinute3, -1); d.Allowed || w != before {
		t.Errorf("negative hits: %+v, state %+v", d, w)
	}
}

// TestFixedWindowAddKeepsCountBounded: refused hits counted by Add stop at
// one over the limit, which answers every later request as the full count
// would, and which Validate accepts.
func TestFixedWindowAddKeepsCountBounded(t *testing.T) {
	var w algorithms.FixedWindow
	for range 100 {
		w.Add(t0.Add(5*s), perMinute3, 2)
	}
	if w.Count != perMinute3.Count+1 {
		t.Errorf("count after 100 refused adds = %d, want %d", w.Count, perMinute3.Count+1)
	}
	if d := w.Add(t0.Add(6*s), perMinute3, 0); d.Allowed || d.Remaining != 0 {
		t.Errorf("peek at a window over its limit: %+v, want refused with 0 remaining", d)
	}
	if err := w.Validate(t0.Add(6*s), perMinute3, 0); err != nil {
		t.Errorf("Validate: %v", err)
	}
}
