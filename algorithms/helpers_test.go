package algorithms_test

import (
	"slices"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// t0 is the fixed start of every timeline: a whole minute, so that
// window-aligned algorithms start a window at t0.
var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// counter is the shape all six algorithms and Spacing share, for tests
// that cover them all.
type counter interface {
	Take(now time.Time, l algorithms.Limit, n int64) algorithms.Decision
	Check(now time.Time, l algorithms.Limit, n int64) algorithms.Decision
}

// kind names an algorithm and makes a zero-valued state of it.
type kind struct {
	name string
	new  func() counter
}

// kinds lists the six algorithms and Spacing.
func kinds() []kind {
	return []kind{
		{"TokenBucket", func() counter { return new(algorithms.TokenBucket) }},
		{"GCRA", func() counter { return new(algorithms.GCRA) }},
		{"LeakyBucket", func() counter { return new(algorithms.LeakyBucket) }},
		{"FixedWindow", func() counter { return new(algorithms.FixedWindow) }},
		{"SlidingWindow", func() counter { return new(algorithms.SlidingWindow) }},
		{"SlidingLog", func() counter { return new(algorithms.SlidingLog) }},
		{"Spacing", func() counter { return new(algorithms.Spacing) }},
	}
}

// logEntry is one (ts, count) entry of a SlidingLog, for comparisons.
type logEntry struct{ TS, Count int64 }

// entries returns s's log as a slice.
func entries(s *algorithms.SlidingLog) []logEntry {
	var out []logEntry
	for ts, c := range s.Entries() {
		out = append(out, logEntry{ts, c})
	}
	return out
}

// snapshot returns a comparable copy of c's state.
func snapshot(c counter) any {
	switch s := c.(type) {
	case *algorithms.TokenBucket:
		return *s
	case *algorithms.GCRA:
		return *s
	case *algorithms.LeakyBucket:
		return *s
	case *algorithms.FixedWindow:
		return *s
	case *algorithms.SlidingWindow:
		return *s
	case *algorithms.SlidingLog:
		return entries(s)
	case *algorithms.Spacing:
		return *s
	}
	panic("unknown counter")
}

// sameState reports whether two snapshots are equal.
func sameState(a, b any) bool {
	if la, ok := a.([]logEntry); ok {
		return slices.Equal(la, b.([]logEntry))
	}
	return a == b
}

// step is one request of a timeline: n hits at t0+at, and the decision
// expected.
type step struct {
	at   time.Duration
	n    int64
	want algorithms.Decision
}

// runTimeline plays steps against c under l, checking that Check agrees
// with Take and that each Take decides as expected.
func runTimeline(t *testing.T, c counter, l algorithms.Limit, steps []step) {
	t.Helper()
	for i, s := range steps {
		now := t0.Add(s.at)
		checked := c.Check(now, l, s.n)
		got := c.Take(now, l, s.n)
		if got != s.want {
			t.Errorf("step %d: Take(t0+%v, %d) = %+v, want %+v", i, s.at, s.n, got, s.want)
		}
		if checked != got {
			t.Errorf("step %d: Check(t0+%v, %d) = %+v, but Take = %+v", i, s.at, s.n, checked, got)
		}
	}
}

// ok and no build expected decisions tersely.
func ok(remaining int64, reset time.Duration) algorithms.Decision {
	return algorithms.Decision{Allowed: true, Remaining: remaining, ResetAfter: reset}
}

func no(remaining int64, retry, reset time.Duration) algorithms.Decision {
	return algorithms.Decision{Remaining: remaining, RetryAfter: retry, ResetAfter: reset}
}
