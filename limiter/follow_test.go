package limiter

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

var (
	perMinute10 = algorithms.Limit{Count: 10, Period: time.Minute}
	// hostile is the poisoned limit: one hit of it costs a year.
	hostile = algorithms.Limit{Count: 1, Period: 365 * 24 * time.Hour}
)

// TestPoisonedLimit is the attack: one check with a year-long limit on a
// name and key, then the application's own 10 per minute on them. The
// counter follows the limit: the application's limit is locked out for at
// most one of its own periods, not a year.
func TestPoisonedLimit(t *testing.T) {
	for a := range NumAlgorithms {
		s := New(Config{})
		r := Request{Name: "api", Key: "user:1", Algorithm: a, Hits: 1, Now: t0, Limit: hostile}
		if d := s.Decide(&r); !d.Allowed {
			t.Fatalf("%s: the hostile check was refused: %+v", a, d)
		}
		r.Limit, r.Hits = perMinute10, 10
		if d := s.Check(&r); !d.Allowed && (d.RetryAfter < 0 || d.RetryAfter > time.Minute) {
			t.Errorf("%s: after the hostile check, 10 of 10/minute must wait %v, want at most a minute", a, d.RetryAfter)
		}
		r.Now = t0.Add(time.Minute)
		if d := s.Decide(&r); !d.Allowed {
			t.Errorf("%s: a minute after the hostile check, 10 of 10/minute refused: %+v", a, d)
		}
	}
}

// TestCheckClampsAsDecideWould: a check under a new limit answers what a
// decision under it then does.
func TestCheckClampsAsDecideWould(t *testing.T) {
	for a := range NumAlgorithms {
		s := New(Config{})
		r := Request{Name: "api", Key: "k", Algorithm: a, Hits: 1, Now: t0, Limit: hostile}
		s.Decide(&r)
		r.Limit, r.Now = perMinute10, t0.Add(time.Second)
		checked := s.Check(&r)
		if d := s.Decide(&r); d != checked {
			t.Errorf("%s: Check under a new limit = %+v, then Decide = %+v", a, checked, d)
		}
	}
}

// TestLoweredLimitIsHandedOff: a counter charged under a limit and then
// checked under a lower one holds a state valid under the lower one, so
// the new owner accepts it (it used to refuse it as invalid, leaving it on
// the old node) and goes on from the lower limit.
func TestLoweredLimitIsHandedOff(t *testing.T) {
	lower := algorithms.Limit{Count: 5, Period: time.Minute, Burst: 2}
	for a := range NumAlgorithms {
		from, to := New(Config{}), New(Config{})
		decide(from, a, perMinute10, 10, 0)
		decide(from, a, lower, 0, time.Second)
		for _, c := range handOff(t, from, to, t0.Add(time.Second)) {
			if c.Limit != lower {
				t.Errorf("%s: handed off with limit %+v, want %+v", a, c.Limit, lower)
			}
		}
		if d := decide(to, a, lower, 1, time.Second); d.Allowed {
			t.Errorf("%s: the receiver admitted a hit its lowered limit had no room for: %+v", a, d)
		}
	}
}

// decide decides hits of the counter ("api", "k") of algorithm a in s,
// under l at t0+at.
func decide(s *Store, a Algorithm, l algorithms.Limit, hits int64, at time.Duration) algorithms.Decision {
	return s.Decide(&Request{Name: "api", Key: "k", Algorithm: a, Hits: hits, Now: t0.Add(at), Limit: l})
}

// handOff moves every counter of from into to at now, as hand-off does,
// failing the test for each one to refuses, and returns them.
func handOff(t *testing.T, from, to *Store, now time.Time) []Counter {
	t.Helper()
	var moved []Counter
	for c := range from.Extract(func(string) bool { return true }) {
		if err := to.Merge(c, now, skew); err != nil {
			t.Errorf("%s: the receiver refused %+v: %v", c.Algorithm, c, err)
		}
		moved = append(moved, c)
	}
	return moved
}

// TestMergeUnderAnotherLimitIsClamped: a handed-off state charged under a
// year-long limit, merged into a counter the application has checked since
// under 10 per minute, holds that counter for at most a minute: merging two
// limits clamps to the one kept.
func TestMergeUnderAnotherLimitIsClamped(t *testing.T) {
	for a := range NumAlgorithms {
		poisoned, held := New(Config{}), New(Config{})
		decide(poisoned, a, hostile, 1, 0)
		decide(held, a, perMinute10, 0, time.Second)
		handOff(t, poisoned, held, t0.Add(time.Second))
		for c := range held.Counters() {
			if err := New(Config{}).Merge(c, time.Unix(0, c.Last), 0); err != nil {
				t.Errorf("%s: the merged counter is not valid under its limit: %v", a, err)
			}
		}
		if d := decide(held, a, perMinute10, 10, time.Second+time.Minute); !d.Allowed {
			t.Errorf("%s: a minute after merging a year-long state, 10 of 10/minute refused: %+v", a, d)
		}
	}
}

// TestChangedLimitDoesNotAllocate: deciding under a limit that changes on
// every request (each one clamps) allocates nothing.
func TestChangedLimitDoesNotAllocate(t *testing.T) {
	s := New(Config{})
	limits := [2]algorithms.Limit{{Count: 1000, Period: time.Second}, {Count: 10, Period: 2 * time.Second}}
	for a := range NumAlgorithms {
		r := Request{Name: "api", Key: "user:42", Algorithm: a, Hits: 1, Now: t0, Limit: limits[0]}
		s.Decide(&r) // create the counter
		i := 0
		if n := testing.AllocsPerRun(100, func() {
			i++
			r.Limit = limits[i%2]
			s.Decide(&r)
		}); n != 0 {
			t.Errorf("%s: Decide under a changing limit allocates %v times per call, want 0", a, n)
		}
	}
}
