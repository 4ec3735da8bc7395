package algorithms_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// capacity is the most hits a counter of kind name can hold under l.
func capacity(name string, l algorithms.Limit) int64 {
	switch name {
	case "TokenBucket", "GCRA", "LeakyBucket":
		return l.Capacity()
	case "Spacing":
		return 1 // requests, not hits
	}
	return l.Count
}

// checkDecision plays one request against c and checks the invariants
// every algorithm keeps: Check answers what Take then does and changes
// nothing; Remaining lies in [0, capacity]; a refused request has a
// positive RetryAfter (or Never) and changes nothing; an admitted one has
// none.
func checkDecision(t *testing.T, name string, c counter, now time.Time, l algorithms.Limit, n int64) algorithms.Decision {
	t.Helper()
	before := snapshot(c)
	checked := c.Check(now, l, n)
	if after := snapshot(c); !sameState(before, after) {
		t.Fatalf("%s.Check(%v, %+v, %d) changed the state from %+v to %+v", name, now, l, n, before, after)
	}
	d := c.Take(now, l, n)
	switch {
	case d != checked:
		t.Fatalf("%s: Check = %+v but Take = %+v (limit %+v, n %d)", name, checked, d, l, n)
	case d.Remaining < 0 || l.Validate() == nil && d.Remaining > capacity(name, l):
		t.Fatalf("%s: Remaining %d outside [0, %d] (limit %+v)", name, d.Remaining, capacity(name, l), l)
	case d.ResetAfter < 0 || d.Delay < 0:
		t.Fatalf("%s: negative duration in %+v", name, d)
	case d.Allowed && d.RetryAfter != 0:
		t.Fatalf("%s: admitted with RetryAfter in %+v", name, d)
	case !d.Allowed && d.RetryAfter <= 0 && d.RetryAfter != algorithms.Never:
		t.Fatalf("%s: refused without a RetryAfter in %+v (limit %+v, n %d)", name, d, l, n)
	}
	if d.Allowed {
		return d
	}
	// The sliding log may drop expired entries on a refusal, which no
	// decision can observe; the others must not change at all.
	if _, isLog := c.(*algorithms.SlidingLog); isLog {
		if again := c.Check(now, l, n); again != checked {
			t.Fatalf("%s: refused Take changed Check from %+v to %+v", name, checked, again)
		}
	} else if after := snapshot(c); !sameState(before, after) {
		t.Fatalf("%s: refused Take changed the state from %+v to %+v", name, before, after)
	}
	return d
}

// TestCheckMatchesTake plays random timelines through every algorithm.
func TestCheckMatchesTake(t *testing.T) {
	for _, k := range kinds() {
		t.Run(k.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 4))
			for range 300 {
				tl := newRandomTimeline(rng, 50)
				c := k.new()
				for j := range tl.at {
					checkDecision(t, k.name, c, t0.Add(tl.at[j]), tl.limit, tl.n[j])
				}
			}
		})
	}
}

// TestInvalid checks that invalid limits, negative hits and a sliding log
// above its maximum are refused with Never by every algorithm.
func TestInvalid(t *testing.T) {
	good := algorithms.Limit{Count: 1, Period: time.Second}
	bad := []algorithms.Limit{
		{Count: 0, Period: time.Second},
		{Count: 1, Period: 0},
		{Count: 1, Period: time.Second, Burst: -1},
	}
	for _, k := range kinds() {
		for _, l := range bad {
			if err := l.Validate(); err == nil {
				t.Errorf("%+v.Validate() = nil", l)
			}
			if d := k.new().Take(t0, l, 1); d != (algorithms.Decision{RetryAfter: algorithms.Never}) {
				t.Errorf("%s.Take with %+v = %+v, want refused with Never", k.name, l, d)
			}
		}
		if d := k.new().Take(t0, good, -1); d != (algorithms.Decision{RetryAfter: algorithms.Never}) {
			t.Errorf("%s.Take(-1) = %+v, want refused with Never", k.name, d)
		}
	}
	big := algorithms.Limit{Count: algorithms.MaxSlidingLogLimit + 1, Period: time.Second}
	if err := algorithms.ValidateSlidingLog(big); err == nil {
		t.Errorf("ValidateSlidingLog(%+v) = nil", big)
	}
	if err := algorithms.ValidateSlidingLog(good); err != nil {
		t.Errorf("ValidateSlidingLog(%+v) = %v", good, err)
	}
	if d := new(algorithms.SlidingLog).Take(t0, big, 1); d.Allowed || d.RetryAfter != algorithms.Never {
		t.Errorf("SlidingLog.Take above the maximum = %+v, want refused with Never", d)
	}
}

// TestBackwards checks that a clock going back is taken as no time
// passing: nothing is refilled or uncounted.
func TestBackwards(t *testing.T) {
	l := algorithms.Limit{Count: 2, Period: time.Minute}
	for _, k := range kinds() {
		c := k.new()
		c.Take(t0.Add(90*time.Second), l, 2)
		for _, back := range []time.Duration{89 * time.Second, 30 * time.Second, -time.Hour} {
			if d := checkDecision(t, k.name, c, t0.Add(back), l, 1); d.Allowed {
				t.Errorf("%s: after 2 of 2 at t0+90s, Take at t0%+v = %+v, want refused", k.name, back, d)
			}
		}
	}
}

// TestAllocs proves that a decision allocates nothing, once a sliding log
// has grown to hold a full window.
func TestAllocs(t *testing.T) {
	l := algorithms.Limit{Count: 1000, Period: time.Second}
	for _, k := range kinds() {
		c, now := k.new(), t0
		for range 3000 {
			now = now.Add(time.Millisecond)
			c.Take(now, l, 1)
		}
		if n := testing.AllocsPerRun(1000, func() {
			now = now.Add(time.Millisecond)
			c.Check(now, l, 1)
			c.Take(now, l, 1)
		}); n != 0 {
			t.Errorf("%s: Check and Take allocate %v times per call, want 0", k.name, n)
		}
	}
}

// FuzzTake feeds random limits, hits and time steps (including steps
// back) to every algorithm and checks the invariants of checkDecision.
// Each 3-byte chunk of script is one request: a time step, a number of
// hits, and a selector for extreme hit counts.
func FuzzTake(f *testing.F) {
	f.Add(int64(3), int64(time.Minute), int64(0), []byte{5, 1, 0, 10, 1, 0, 46, 1, 0, 9, 1, 0, 30, 1, 0, 10, 1, 0, 30, 1, 0})
	f.Add(int64(2), int64(time.Second), int64(2), []byte{0, 1, 0, 0, 1, 0, 0, 1, 0, 255, 1, 0, 128, 3, 0})
	f.Add(int64(1e9), int64(365*24*time.Hour), int64(1e9), []byte{0, 255, 1, 1, 1, 0, 0, 0, 2})
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), []byte{0, 0, 1, 0, 0, 2})
	f.Add(int64(0), int64(-1), int64(-1), []byte{1, 1, 1})
	f.Fuzz(func(t *testing.T, count, period, burst int64, script []byte) {
		l := algorithms.Limit{Count: count, Period: time.Duration(period), Burst: burst}
		if len(script) > 3*300 {
			script = script[:3*300] // keep each input quick
		}
		// Steps of up to 254·period/64, capped so that now stays within
		// the years 1970 to 2262 that Unix ns can hold.
		year := 365 * 24 * time.Hour
		step := min(max(time.Duration(period)/64, 1), year)
		first, last := time.Unix(0, 0), time.Unix(0, math.MaxInt64).Add(-2*year)
		for _, k := range kinds() {
			c, now := k.new(), t0
			for i := 0; i+3 <= len(script); i += 3 {
				gap, hits, sel := script[i], int64(script[i+1]), script[i+2]
				next := now.Add(step * time.Duration(gap))
				if gap == 255 {
					next = now.Add(-step * 32) // the clock went back
				}
				if next.After(first) && next.Before(last) {
					now = next
				}
				switch sel {
				case 1:
					hits = l.Capacity() - hits
				case 2:
					hits = math.MaxInt64 - hits
				case 3:
					hits = -hits
				}
				checkDecision(t, k.name, c, now, l, hits)
			}
		}
	})
}

// TestMergeBuckets checks that the bucket algorithms keep the emptier
// state, from either side, and that merging a fresh state changes nothing.
func TestMergeBuckets(t *testing.T) {
	l := algorithms.Limit{Count: 2, Period: time.Second}
	t.Run("TokenBucket", func(t *testing.T) {
		var more, less algorithms.TokenBucket
		more.Take(t0, l, 2)
		less.Take(t0, l, 1)
		testMerge(t, more, less, func(a *algorithms.TokenBucket, b algorithms.TokenBucket) { a.Merge(b) })
	})
	t.Run("GCRA", func(t *testing.T) {
		var more, less algorithms.GCRA
		more.Take(t0, l, 2)
		less.Take(t0, l, 1)
		testMerge(t, more, less, func(a *algorithms.GCRA, b algorithms.GCRA) { a.Merge(b) })
	})
	t.Run("LeakyBucket", func(t *testing.T) {
		var more, less algorithms.LeakyBucket
		more.Take(t0, l, 2)
		less.Take(t0, l, 1)
		testMerge(t, more, less, func(a *algorithms.LeakyBucket, b algorithms.LeakyBucket) { a.Merge(b) })
	})
	t.Run("FixedWindow", func(t *testing.T) {
		var more, less, earlier algorithms.FixedWindow
		earlier.Take(t0.Add(-time.Second), l, 2)
		more.Take(t0, l, 2)
		less.Take(t0, l, 1)
		testMerge(t, more, less, func(a *algorithms.FixedWindow, b algorithms.FixedWindow) { a.Merge(b) })
		// A later window wins over a fuller earlier one.
		testMerge(t, less, earlier, func(a *algorithms.FixedWindow, b algorithms.FixedWindow) { a.Merge(b) })
	})
}

// testMerge checks that merging less into more keeps more, merging more
// into less gives more, and merging a zero state changes nothing.
func testMerge[S comparable](t *testing.T, more, less S, merge func(*S, S)) {
	t.Helper()
	a, b := more, less
	merge(&a, less)
	merge(&b, more)
	if a != more || b != more {
		t.Errorf("merging %+v and %+v gave %+v and %+v, want %+v both ways", more, less, a, b, more)
	}
	var zero S
	merge(&a, zero)
	if a != more {
		t.Errorf("merging a zero state into %+v gave %+v", more, a)
	}
}

func TestMergeSlidingWindow(t *testing.T) {
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	take := func(at time.Duration, n int64) algorithms.SlidingWindow {
		var w algorithms.SlidingWindow
		w.Take(t0.Add(at), l, n)
		return w
	}
	w0 := take(0, 5)                   // window t0: 5 hits
	w1 := take(-time.Minute, 3)        // window t0-1m: 3 hits
	w1.Take(t0.Add(time.Second), l, 1) // then window t0: 3 previous, 1 current
	var far algorithms.SlidingWindow
	far.Take(t0.Add(3*time.Minute), l, 2)

	for _, tc := range []struct {
		name string
		a, b algorithms.SlidingWindow
		want algorithms.SlidingWindow
	}{
		{"same window", w0, w1, algorithms.SlidingWindow{Start: w0.Start, Prev: 3, Curr: 5, Period: int64(time.Minute)}},
		{"adjacent", take(-time.Minute, 4), w1, algorithms.SlidingWindow{Start: w1.Start, Prev: 4, Curr: 1, Period: int64(time.Minute)}},
		{"far ahead", w0, far, far},
		{"zero", w0, algorithms.SlidingWindow{}, w0},
	} {
		for _, order := range [][2]algorithms.SlidingWindow{{tc.a, tc.b}, {tc.b, tc.a}} {
			got := order[0]
			got.Merge(order[1])
			if got != tc.want {
				t.Errorf("%s: %+v.Merge(%+v) = %+v, want %+v", tc.name, order[0], order[1], got, tc.want)
			}
		}
	}
}

// TestMergeSlidingLog checks that the merged log holds, for every window,
// the larger of the two logs' hits, and shares no memory with either.
func TestMergeSlidingLog(t *testing.T) {
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	var a, b algorithms.SlidingLog
	a.Take(t0, l, 2)
	a.Take(t0.Add(30*time.Second), l, 1)
	b.Take(t0.Add(10*time.Second), l, 1)
	b.Take(t0.Add(20*time.Second), l, 1)
	b.Take(t0.Add(30*time.Second), l, 1)
	bWas := entries(&b)

	m := a.Clone()
	m.Merge(b)
	s := int64(time.Second)
	ts := t0.UnixNano()
	want := []logEntry{{ts + 10*s, 1}, {ts + 20*s, 1}, {ts + 30*s, 1}}
	if got := entries(&m); !slices.Equal(got, want) {
		t.Errorf("merged log %v, want %v", got, want)
	}
	for at := time.Duration(0); at <= 100*time.Second; at += time.Second {
		now := t0.Add(at)
		got := m.Check(now, l, 0).Remaining
		want := min(a.Check(now, l, 0).Remaining, b.Check(now, l, 0).Remaining)
		if got != want {
			t.Errorf("at t0+%v: merged log has %d remaining, want %d", at, got, want)
		}
	}
	m.Take(t0.Add(40*time.Second), l, 5)
	if got := entries(&b); !slices.Equal(got, bWas) {
		t.Errorf("merging changed its argument: %v, was %v", got, bWas)
	}
	// Round trip through Entries and Append.
	var rebuilt algorithms.SlidingLog
	for ts, n := range m.Entries() {
		rebuilt.Append(ts, n)
	}
	if !slices.Equal(entries(&rebuilt), entries(&m)) {
		t.Errorf("rebuilt log %v, want %v", entries(&rebuilt), entries(&m))
	}
}
