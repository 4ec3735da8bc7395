package algorithms_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// giver is a counter that can give hits back: the six algorithms, not
// Spacing.
type giver interface {
	counter
	GiveBack(now, takenAt time.Time, l algorithms.Limit, taken, n int64)
}

// givers returns the six algorithms as givers.
func givers() []struct {
	name string
	new  func() giver
} {
	var out []struct {
		name string
		new  func() giver
	}
	for _, k := range kinds() {
		if _, ok := k.new().(giver); ok {
			out = append(out, struct {
				name string
				new  func() giver
			}{k.name, func() giver { return k.new().(giver) }})
		}
	}
	return out
}

func TestSpacingHasNoGiveBack(t *testing.T) {
	if _, ok := any(new(algorithms.Spacing)).(giver); ok {
		t.Fatal("Spacing gives back, but it counts requests, not hits")
	}
	if n := len(givers()); n != 6 {
		t.Fatalf("%d algorithms give back, want all 6", n)
	}
}

// TestGiveBackTimelines plays the life of a reservation on each algorithm
// (10 per minute, an emission interval of 6 s): reserve 6, then settle for
// 2 (give 4 back), settle for 8 (take 2 more, forced), release (give all 6
// back) or let it expire (nothing given back), and checks the state the
// counter is left in.
func TestGiveBackTimelines(t *testing.T) {
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	cases := []struct {
		name string
		// after acts on a state that reserved 6 at t0, at t0.
		after func(g giver)
		// remaining is what a peek at t0 reports then.
		remaining int64
	}{
		{"reserve", func(giver) {}, 4},
		{"settle less", func(g giver) { g.GiveBack(t0, t0, l, 6, 4) }, 8},
		{"settle more", func(g giver) { g.Take(t0, l, 2) }, 2},
		{"release", func(g giver) { g.GiveBack(t0, t0, l, 6, 6) }, 10},
		{"expiry charges in full", func(giver) {}, 4},
		{"give back more than held", func(g giver) { g.GiveBack(t0, t0, l, 6, math.MaxInt64) }, 10},
	}
	for _, k := range givers() {
		for _, c := range cases {
			t.Run(k.name+"/"+c.name, func(t *testing.T) {
				g := k.new()
				if d := g.Take(t0, l, 6); !d.Allowed {
					t.Fatalf("reserve 6 refused: %+v", d)
				}
				c.after(g)
				if got := g.Check(t0, l, 0).Remaining; got != c.remaining {
					t.Errorf("remaining %d, want %d", got, c.remaining)
				}
				if c.remaining == 10 {
					// Back at rest: it decides as a fresh counter does.
					fresh := k.new()
					for _, at := range []time.Duration{0, time.Second, 59 * time.Second, 2 * time.Minute} {
						for _, n := range []int64{0, 1, 10, 11} {
							if got, want := g.Check(t0.Add(at), l, n), fresh.Check(t0.Add(at), l, n); got != want {
								t.Errorf("Check(t0+%v, %d) = %+v, a fresh counter %+v", at, n, got, want)
							}
						}
					}
				}
			})
		}
	}
}

// TestGiveBackAsIfCharged: a counter that reserved 6 at t0, admitted 1
// more and settled for 2 (giving 4 back) decides from then on exactly as
// one that was charged 2 at t0 and the 1 beside it, on every algorithm:
// give-back is exact, with no rounding, while the reserved hits are still
// held: settled at once, or for 10 a minute (an emission interval of 6 s)
// 2 s later, while the bucket algorithms still hold the 4 unused hits.
// With 30 per 10 s the emission interval is 1s/3, not a whole number of
// nanoseconds.
func TestGiveBackAsIfCharged(t *testing.T) {
	for _, c := range []struct {
		l             algorithms.Limit
		other, settle time.Duration // when the other hit and the settle come, after t0
	}{
		{algorithms.Limit{Count: 10, Period: time.Minute}, time.Second, 2 * time.Second},
		{algorithms.Limit{Count: 30, Period: 10 * time.Second, Burst: 12}, 0, 0},
	} {
		for _, k := range givers() {
			t.Run(fmt.Sprintf("%s/%d per %v", k.name, c.l.Count, c.l.Period), func(t *testing.T) {
				reserved, charged := k.new(), k.new()
				reserved.Take(t0, c.l, 6)
				reserved.Take(t0.Add(c.other), c.l, 1)
				reserved.GiveBack(t0.Add(c.settle), t0, c.l, 6, 4)
				charged.Take(t0, c.l, 2)
				charged.Take(t0.Add(c.other), c.l, 1)
				for at := c.settle; at <= 3*time.Minute; at += 1500 * time.Millisecond {
					for _, n := range []int64{0, 1, 5, 8} {
						now := t0.Add(at)
						if got, want := reserved.Check(now, c.l, n), charged.Check(now, c.l, n); got != want {
							t.Fatalf("Check(t0+%v, %d) = %+v after give-back, %+v if charged the cost", at, n, got, want)
						}
					}
				}
			})
		}
	}
}

// TestGiveBackDrained: a bucket's taken hits drain as it refills, the
// unused ones with the rest, so a give-back after a while returns only
// what they still hold. 10 a minute: 6 taken at t0 span 36 s; settled
// for 0 at t0+30s, 6 s of them (one hit) are still held, and that is all
// that goes back, although other takes kept the bucket from refilling.
func TestGiveBackDrained(t *testing.T) {
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	for _, k := range givers()[:3] {
		g := k.new()
		g.Take(t0, l, 6)
		g.Take(t0.Add(29*time.Second), l, 4) // 6 of 10 missing at t0+29s (5 refilled), then 4 more
		now := t0.Add(30 * time.Second)
		before := g.Check(now, l, 0).Remaining
		g.GiveBack(now, t0, l, 6, 6)
		if got := g.Check(now, l, 0).Remaining; got != before+1 {
			t.Errorf("%s: remaining %d after giving back 6 taken 30 s ago, want %d: only the one hit still held", k.name, got, before+1)
		}
	}
}

// TestGiveBackSubNanosecond: with an emission interval of 1s/3, taking
// one hit and giving it back at once leaves a full bucket exactly.
func TestGiveBackSubNanosecond(t *testing.T) {
	l := algorithms.Limit{Count: 3, Period: time.Second}
	for _, k := range givers() {
		t.Run(k.name, func(t *testing.T) {
			g := k.new()
			g.Take(t0, l, 1)
			g.Take(t0, l, 1)
			g.GiveBack(t0, t0, l, 1, 1)
			one := k.new()
			one.Take(t0, l, 1)
			for _, at := range []time.Duration{0, 1, 333333333, 333333334, time.Second} {
				if got, want := g.Check(t0.Add(at), l, 3), one.Check(t0.Add(at), l, 3); got != want {
					t.Errorf("Check(t0+%v, 3) = %+v, want %+v", at, got, want)
				}
			}
		})
	}
}

// TestGiveBackOnlyWhereTaken checks each algorithm's rule for hits whose
// window or refill has moved on: nothing is given back beyond what the
// hits still hold.
func TestGiveBackOnlyWhereTaken(t *testing.T) {
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	t.Run("buckets never above capacity", func(t *testing.T) {
		for _, k := range givers()[:3] {
			g := k.new()
			g.Take(t0, l, 6)
			// 12 s later 2 have refilled; giving 6 back fills the bucket,
			// no more: 10 are admitted at once, not 12.
			now := t0.Add(12 * time.Second)
			g.GiveBack(now, t0, l, 6, 6)
			if d := g.Check(now, l, 0); d.Remaining != 10 || d.ResetAfter != 0 {
				t.Errorf("%s: %+v after giving back, want a full bucket", k.name, d)
			}
			if d := g.Take(now, l, 10); !d.Allowed {
				t.Errorf("%s: a full burst refused after give-back: %+v", k.name, d)
			}
			if d := g.Take(now, l, 1); d.Allowed {
				t.Errorf("%s: an 11th hit admitted: give-back went above capacity", k.name)
			}
		}
	})
	t.Run("fixed window: not into a later window", func(t *testing.T) {
		var w algorithms.FixedWindow
		w.Take(t0, l, 6)
		next := t0.Add(time.Minute)
		w.Take(next, l, 3)
		w.GiveBack(next, t0, l, 6, 6)
		if got := w.Check(next, l, 0).Remaining; got != 7 {
			t.Errorf("remaining %d in the next window, want 7: hits of the window before were given back into it", got)
		}
	})
	t.Run("sliding window: the previous window, not the current", func(t *testing.T) {
		var w algorithms.SlidingWindow
		w.Take(t0, l, 6)
		now := t0.Add(time.Minute + 30*time.Second)
		w.Take(now, l, 1)
		w.GiveBack(now, t0, l, 6, 4)
		if w.Prev != 2 || w.Curr != 1 {
			t.Errorf("prev %d, curr %d; want 2 and 1", w.Prev, w.Curr)
		}
		later := now.Add(time.Minute) // t0's window has slid out
		before := w.Check(later, l, 0)
		w.GiveBack(later, t0, l, 6, 2)
		if after := w.Check(later, l, 0); after != before {
			t.Errorf("after giving back hits of a window that slid out: %+v, want %+v", after, before)
		}
	})
	t.Run("sliding log: only the entry taken at takenAt", func(t *testing.T) {
		var s algorithms.SlidingLog
		s.Take(t0, l, 2)
		s.Take(t0.Add(time.Second), l, 6)
		s.Take(t0.Add(2*time.Second), l, 1)
		s.GiveBack(t0.Add(3*time.Second), t0.Add(time.Second), l, 6, 4)
		want := []logEntry{{t0.UnixNano(), 2}, {t0.Add(time.Second).UnixNano(), 2}, {t0.Add(2 * time.Second).UnixNano(), 1}}
		if got := entries(&s); !sameState(got, want) {
			t.Errorf("entries %v, want %v", got, want)
		}
		s.GiveBack(t0.Add(3*time.Second), t0.Add(time.Second), l, 6, 100)
		want = []logEntry{want[0], want[2]}
		if got := entries(&s); !sameState(got, want) {
			t.Errorf("entries %v after release, want %v", got, want)
		}
		s.GiveBack(t0.Add(3*time.Second), t0.Add(1500*time.Millisecond), l, 100, 100) // nothing logged then
		if got := entries(&s); !sameState(got, want) {
			t.Errorf("entries %v after giving back at an instant with no entry, want %v", got, want)
		}
		if got := s.Check(t0.Add(3*time.Second), l, 0).Remaining; got != 7 {
			t.Errorf("remaining %d, want 7", got)
		}
	})
}

func TestGiveBackDoesNotAllocate(t *testing.T) {
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	for _, k := range givers() {
		g := k.new()
		g.Take(t0, l, 1)
		if n := testing.AllocsPerRun(100, func() { g.Take(t0, l, 1); g.GiveBack(t0, t0, l, 1, 1) }); n != 0 {
			t.Errorf("%s: GiveBack allocates %v times", k.name, n)
		}
	}
}

// TestGiveBackNeverUndercharges plays random reservations on each
// algorithm: each takes an estimate at its start and, some time later,
// gives back what its cost did not use. Beside it a second counter is
// charged only the cost, at the start. The reserving counter must never
// be less charged than that one: whenever it admits an estimate, the
// other admits the cost, and it never reports more remaining. So
// give-back never refills beyond what the hits still hold.
func TestGiveBackNeverUndercharges(t *testing.T) {
	for _, l := range []algorithms.Limit{
		{Count: 10, Period: time.Second},
		{Count: 7, Period: 3 * time.Second, Burst: 4},
		{Count: 100, Period: time.Minute},
	} {
		for _, k := range givers() {
			t.Run(fmt.Sprintf("%s/%d per %v", k.name, l.Count, l.Period), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(l.Count), uint64(l.Period)))
				res, real := k.new(), k.new()
				type open struct {
					at, settle  time.Time
					taken, back int64
				}
				var pending []open
				now := t0
				for step := range 3000 {
					now = now.Add(time.Duration(rng.Int64N(int64(l.Period / 3))))
					// Settle what is due, in time order, as a store does.
					slices.SortFunc(pending, func(a, b open) int { return a.settle.Compare(b.settle) })
					kept := pending[:0]
					for _, p := range pending {
						if p.settle.After(now) {
							kept = append(kept, p)
							continue
						}
						res.GiveBack(p.settle, p.at, l, p.taken, p.back)
					}
					pending = kept
					if got, want := res.Check(now, l, 0).Remaining, real.Check(now, l, 0).Remaining; got > want {
						t.Fatalf("step %d: %d remaining after give-backs, but %d had only the costs been charged", step, got, want)
					}
					estimate := 1 + rng.Int64N(min(l.Capacity(), l.Count))
					cost := rng.Int64N(estimate + 1)
					if !res.Take(now, l, estimate).Allowed {
						continue
					}
					if !real.Take(now, l, cost).Allowed {
						t.Fatalf("step %d: an estimate of %d admitted, but its cost %d refused on the counter charged only costs", step, estimate, cost)
					}
					pending = append(pending, open{at: now, settle: now.Add(time.Duration(rng.Int64N(int64(2 * l.Period)))), taken: estimate, back: estimate - cost})
				}
			})
		}
	}
}
