package algorithms_test

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

const (
	minute = time.Minute
	year   = 365 * 24 * time.Hour
)

var perMinute10 = algorithms.Limit{Count: 10, Period: minute}

// TestClamp plays, per algorithm, a state charged under one limit, then
// clamped under another at t0+at, against the state it must become and the
// decisions the new limit then gives.
func TestClamp(t *testing.T) {
	ns := t0.UnixNano()
	sec := int64(time.Second)
	for _, tc := range []struct {
		name  string
		s     state
		at    time.Duration
		l     algorithms.Limit
		want  state
		steps []step // under l, after the clamp
	}{
		{
			name: "token bucket a year in debt owes one minute",
			s:    &algorithms.TokenBucket{Full: t0.Add(year).UnixNano()},
			l:    perMinute10,
			want: &algorithms.TokenBucket{Full: ns + 60*sec},
			// Exactly empty under 10/minute: one hit every 6 s from now.
			steps: []step{{0, 1, no(0, 6*s, 60*s)}, {6 * s, 1, ok(0, 60*s)}, {66 * s, 10, ok(0, 60*s)}},
		},
		{
			name: "token bucket clamped to a fraction of a nanosecond",
			s:    &algorithms.TokenBucket{Full: t0.Add(year).UnixNano()},
			l:    algorithms.Limit{Count: 3, Period: time.Second, Burst: 2},
			want: &algorithms.TokenBucket{Full: ns + 666666666, FullFrac: 2}, // 2/3 s exactly
		},
		{
			name: "token bucket within the new capacity is unchanged",
			s:    &algorithms.TokenBucket{Full: ns + 30*sec},
			l:    perMinute10,
			want: &algorithms.TokenBucket{Full: ns + 30*sec},
		},
		{
			name: "token bucket fraction of a larger count read as the decisions read it",
			s:    &algorithms.TokenBucket{Full: ns + sec/2, FullFrac: 999},
			l:    algorithms.Limit{Count: 3, Period: time.Second},
			want: &algorithms.TokenBucket{Full: ns + sec/2, FullFrac: 2},
		},
		{
			name: "token bucket with a negative instant is at rest",
			s:    &algorithms.TokenBucket{Full: -5, FullFrac: 7},
			l:    perMinute10,
			want: &algorithms.TokenBucket{},
		},
		{
			name:  "GCRA TAT a year ahead is a full burst ahead",
			s:     &algorithms.GCRA{TAT: t0.Add(year).UnixNano()},
			l:     algorithms.Limit{Count: 2, Period: time.Second, Burst: 4},
			want:  &algorithms.GCRA{TAT: ns + 2*sec},
			steps: []step{{0, 1, no(0, 500*time.Millisecond, 2*s)}, {500 * time.Millisecond, 1, ok(0, 2*s)}},
		},
		{
			name:  "leaky bucket queue shortened to its new capacity",
			s:     &algorithms.LeakyBucket{Drained: t0.Add(year).UnixNano()},
			l:     algorithms.Limit{Count: 10, Period: time.Second, Burst: 5},
			want:  &algorithms.LeakyBucket{Drained: ns + sec/2},
			steps: []step{{0, 1, no(0, 100*time.Millisecond, 500*time.Millisecond)}},
		},
		{
			name: "fixed window over the new limit is marked over it",
			s:    &algorithms.FixedWindow{Start: ns, Count: 1e9},
			at:   10 * s,
			l:    perMinute10,
			want: &algorithms.FixedWindow{Start: ns, Count: 11},
			steps: []step{
				{10 * s, 1, no(0, 50*s, 50*s)},
				{10 * s, 0, no(0, 50*s, 50*s)}, // a peek: over the limit
				{60 * s, 10, ok(0, 60*s)},      // the next window is fresh
			},
		},
		{
			name:  "fixed window of a minute moves into the hour that holds it",
			s:     &algorithms.FixedWindow{Start: ns + 30*60*sec, Count: 7},
			at:    30*minute + 10*s,
			l:     algorithms.Limit{Count: 10, Period: time.Hour},
			want:  &algorithms.FixedWindow{Start: ns, Count: 7},
			steps: []step{{30*minute + 10*s, 4, no(3, 29*minute+50*s, 29*minute+50*s)}, {30*minute + 10*s, 3, ok(0, 29*minute+50*s)}},
		},
		{
			name: "fixed window after now moves to now's",
			s:    &algorithms.FixedWindow{Start: ns + 60*sec, Count: 3},
			at:   10 * s,
			l:    perMinute10,
			want: &algorithms.FixedWindow{Start: ns, Count: 3},
		},
		{
			name: "fixed window with Add's mark is unchanged",
			s:    &algorithms.FixedWindow{Start: ns, Count: 11},
			l:    perMinute10,
			want: &algorithms.FixedWindow{Start: ns, Count: 11},
		},
		{
			name: "sliding window counts capped",
			s:    &algorithms.SlidingWindow{Start: ns, Prev: 500, Curr: 300, Period: int64(minute)},
			at:   15 * s,
			l:    algorithms.Limit{Count: 100, Period: minute},
			want: &algorithms.SlidingWindow{Start: ns, Prev: 100, Curr: 100, Period: int64(minute)},
		},
		{
			name: "sliding window of an hour aligned to minutes keeps its counts",
			s:    &algorithms.SlidingWindow{Start: ns, Prev: 50, Curr: 40, Period: int64(time.Hour)},
			at:   30 * s,
			l:    algorithms.Limit{Count: 100, Period: minute},
			want: &algorithms.SlidingWindow{Start: ns, Prev: 50, Curr: 40, Period: int64(minute)},
		},
		{
			name:  "sliding window of a minute moves into the hour with its current count",
			s:     &algorithms.SlidingWindow{Start: ns + 30*60*sec, Prev: 20, Curr: 10, Period: int64(minute)},
			at:    30*minute + 5*s,
			l:     algorithms.Limit{Count: 100, Period: time.Hour},
			want:  &algorithms.SlidingWindow{Start: ns, Curr: 10, Period: int64(time.Hour)},
			steps: []step{{30*minute + 5*s, 90, ok(0, 89*minute+55*s)}},
		},
		{
			name: "sliding log drops the oldest excess",
			s:    logOf(ns-50*sec, 4, ns-20*sec, 4, ns-10*sec, 4),
			l:    algorithms.Limit{Count: 5, Period: minute},
			want: logOf(ns-20*sec, 1, ns-10*sec, 4),
			// 12:00:40 is when the one hit left at ns-20s leaves.
			steps: []step{{0, 1, no(0, 40*s, 50*s)}, {40 * s, 1, ok(0, 60*s)}},
		},
		{
			name: "sliding log drops entries out of the window when it clamps",
			s:    logOf(ns-90*sec, 8, ns-10*sec, 8),
			l:    algorithms.Limit{Count: 5, Period: minute},
			want: logOf(ns-10*sec, 5),
		},
		{
			name: "sliding log under a longer period keeps the newest",
			s:    logOf(ns-90*sec, 5, ns-10*sec, 5),
			l:    algorithms.Limit{Count: 5, Period: 2 * minute},
			want: logOf(ns-10*sec, 5),
		},
		{
			name: "sliding log valid under the new limit is unchanged, old entries and all",
			s:    logOf(ns-90*sec, 5, ns-10*sec, 5),
			l:    algorithms.Limit{Count: 5, Period: minute},
			want: logOf(ns-90*sec, 5, ns-10*sec, 5),
		},
		{
			name: "sliding log hits after now are taken as now's",
			s:    logOf(ns-10*sec, 2, ns+5*sec, 3, ns+6*sec, 1),
			l:    perMinute10,
			want: logOf(ns-10*sec, 2, ns, 4),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := t0.Add(tc.at)
			tc.s.Clamp(now, tc.l)
			if got, want := snapshot(tc.s), snapshot(tc.want); !sameState(got, want) {
				t.Fatalf("clamped to %+v, want %+v", got, want)
			}
			if err := tc.s.Validate(now, tc.l, 0); err != nil {
				t.Errorf("clamped state: %v", err)
			}
			runTimeline(t, tc.s, tc.l, tc.steps)
		})
	}
}

// TestClampYearWindowsUnderAMinute: the poisoned limit on the window
// algorithms. A check of a billion hits per year leaves a year-long window
// behind; under 10 per minute its counts are capped to 10 and belong to a
// window that ended long ago (a year's windows start on whole minutes), so
// the next decision starts afresh.
func TestClampYearWindowsUnderAMinute(t *testing.T) {
	hostile := algorithms.Limit{Count: 1e9, Period: year}
	for _, s := range []state{new(algorithms.FixedWindow), new(algorithms.SlidingWindow)} {
		if d := s.Take(t0, hostile, 1e9); !d.Allowed {
			t.Fatalf("%T: hostile take refused: %+v", s, d)
		}
		s.Clamp(t0, perMinute10)
		if d := s.Take(t0, perMinute10, 10); !d.Allowed {
			t.Errorf("%T after a year's window: 10 of 10/minute refused: %+v", s, d)
		}
	}
}

// randomLimit draws a limit: Count in [1, 1000], Period from 1 ms to an
// hour, or a day, or a year (the hostile kind), Burst 0 or in [1, 1000].
func randomLimit(rng *rand.Rand) algorithms.Limit {
	l := algorithms.Limit{Count: 1 + rng.Int64N(1000)}
	switch rng.IntN(4) {
	case 0:
		l.Period = 24 * time.Hour
	case 1:
		l.Period = year
	default:
		l.Period = time.Millisecond + time.Duration(rng.Int64N(int64(time.Hour)))
	}
	if rng.IntN(2) == 0 {
		l.Burst = 1 + rng.Int64N(1000)
	}
	return l
}

// play charges s with requests random steps apart from now under l, the
// fixed window sometimes with Add (so that it reaches the Count+1 mark),
// and returns the time of the last one and the hits admitted at each step.
func play(rng *rand.Rand, s state, now time.Time, l algorithms.Limit, steps int) (time.Time, []admission) {
	interval := max(l.Period/time.Duration(l.Count), 1)
	var admitted []admission
	for range steps {
		n := rng.Int64N(l.Capacity() + 2)
		switch rng.IntN(6) {
		case 0: // same instant
		case 1:
			now = now.Add(time.Duration(rng.Int64N(int64(l.Period))))
		default: // up to two hits' refill
			now = now.Add(time.Duration(rng.Int64N(int64(min(2*interval, l.Period)))) + 1)
		}
		var d algorithms.Decision
		if w, ok := s.(*algorithms.FixedWindow); ok && rng.IntN(3) == 0 {
			d = w.Add(now, l, n)
		} else {
			d = s.Take(now, l, n)
		}
		if d.Allowed && n > 0 {
			admitted = append(admitted, admission{now.UnixNano(), n})
		}
	}
	return now, admitted
}

// admission is n hits admitted at Unix ns ts.
type admission struct{ ts, n int64 }

// TestClampProperties charges random states under one random limit,
// clamps them under another at a later instant, and checks Clamp's
// promises: the result passes Validate(now, l, 0); a state that already
// passed is unchanged; clamping twice is clamping once; and from then on,
// as the new limit is used, no more is admitted than l allows.
func TestClampProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for k, newState := range states() {
		t.Run(algorithms.Kind(k).String(), func(t *testing.T) {
			for i := range 300 {
				old, l := randomLimit(rng), randomLimit(rng)
				switch rng.IntN(3) {
				case 0:
					l.Period = old.Period // only the count or burst changes
				case 1:
					l = old // no change: Clamp must change nothing
				}
				if algorithms.Kind(k) == algorithms.KindSlidingLog {
					old.Count, l.Count = min(old.Count, 100), min(l.Count, 100) // keep the logs quick
				}
				s := newState()
				last, _ := play(rng, s, t0, old, 30)
				now := last.Add(time.Duration(rng.Int64N(int64(old.Period))))
				wasValid := s.Validate(now, l, 0) == nil
				before := snapshot(s)
				s.Clamp(now, l)
				clamped := snapshot(s)
				if err := s.Validate(now, l, 0); err != nil {
					t.Fatalf("case %d: %+v clamped at %v under %+v (was under %+v) to %+v: %v", i, before, now, l, old, clamped, err)
				}
				if wasValid && !sameState(before, clamped) {
					t.Fatalf("case %d: %+v, valid under %+v, clamped to %+v", i, before, l, clamped)
				}
				if s.Clamp(now, l); !sameState(snapshot(s), clamped) {
					t.Fatalf("case %d: clamping %+v again gave %+v", i, clamped, snapshot(s))
				}
				_, admitted := play(rng, s, now, l, 40)
				if err := withinLimit(algorithms.Kind(k), clamped, l, admitted); err != "" {
					t.Fatalf("case %d: from %+v clamped at %v under %+v: %s (admitted %v)", i, clamped, now, l, err, admitted)
				}
			}
		})
	}
}

// withinLimit checks that hits admitted after a clamp, with what the
// clamped state still counted, are no more than l allows: a window counts
// at most l.Count per window (a sliding log in every window (t-Period, t]);
// a bucket admits at most its capacity plus the refill of the time between
// two admissions (and of one more nanosecond, which TokenBucket lends); a
// spacing admits no request before the clamped Next, nor sooner than Period
// after the last. It returns what is wrong, or "".
func withinLimit(k algorithms.Kind, clamped any, l algorithms.Limit, admitted []admission) string {
	period := int64(l.Period)
	perWindow := map[int64]int64{}
	var log []admission
	switch s := clamped.(type) {
	case algorithms.FixedWindow:
		perWindow[s.Start] = min(s.Count, l.Count)
	case algorithms.SlidingWindow:
		perWindow[s.Start] = s.Curr
	case []logEntry:
		for _, e := range s {
			log = append(log, admission{e.TS, e.Count})
		}
	}
	switch k {
	case algorithms.KindFixedWindow, algorithms.KindSlidingWindow:
		for _, a := range admitted {
			w := a.ts - ((a.ts%period)+period)%period
			if perWindow[w] += a.n; perWindow[w] > l.Count {
				return "more than the limit in the window at " + time.Unix(0, w).UTC().String()
			}
		}
	case algorithms.KindSpacing:
		next := clamped.(algorithms.Spacing).Next
		for _, a := range admitted {
			if a.ts < next {
				return "a request admitted less than the period after the last"
			}
			next = a.ts + period
		}
	case algorithms.KindSlidingLog:
		log = append(log, admitted...)
		for _, end := range log {
			var sum int64
			for _, a := range log {
				if a.ts > end.ts-period && a.ts <= end.ts {
					sum += a.n
				}
			}
			if sum > l.Count {
				return "more than the limit in the period ending " + time.Unix(0, end.ts).UTC().String()
			}
		}
	default:
		for i := range admitted {
			var sum int64
			for j := i; j < len(admitted); j++ {
				sum += admitted[j].n
				if sum > l.Capacity()+refill(admitted[j].ts-admitted[i].ts+1, l) {
					return "more than capacity plus refill between two admissions"
				}
			}
		}
	}
	return ""
}

// refill returns the whole hits l refills in d ns: d·Count/Period.
func refill(d int64, l algorithms.Limit) int64 {
	q := new(big.Int).Mul(big.NewInt(d), big.NewInt(l.Count))
	q.Quo(q, big.NewInt(int64(l.Period)))
	if !q.IsInt64() {
		return math.MaxInt64
	}
	return q.Int64()
}

// TestClampDoesNotAllocate: clamping back and forth between two limits
// allocates nothing, even for a full sliding log.
func TestClampDoesNotAllocate(t *testing.T) {
	big := algorithms.Limit{Count: 1000, Period: time.Second}
	small := algorithms.Limit{Count: 10, Period: 2 * time.Second}
	for k, newState := range states() {
		s, now := newState(), t0
		for range 3000 {
			now = now.Add(time.Millisecond)
			s.Take(now, big, 1)
		}
		if n := testing.AllocsPerRun(1000, func() {
			now = now.Add(time.Millisecond)
			s.Clamp(now, small)
			s.Take(now, small, 1)
			s.Clamp(now, big)
			s.Take(now, big, 1)
		}); n != 0 {
			t.Errorf("%s: Clamp and Take allocate %v times per call, want 0", algorithms.Kind(k), n)
		}
	}
}

// FuzzClamp decodes any state, clamps it under any limit at any time
// from 1970 to 2262, and checks that the result is valid under that
// limit, or, for a limit no decision accepts, that nothing changed.
func FuzzClamp(f *testing.F) {
	tb := &algorithms.TokenBucket{Full: t0.Add(year).UnixNano(), FullFrac: 5}
	f.Add(uint8(algorithms.KindTokenBucket), encodeState(tb), int64(10), int64(minute), int64(0), t0.UnixNano())
	f.Add(uint8(algorithms.KindFixedWindow), encodeState(&algorithms.FixedWindow{Start: t0.UnixNano(), Count: 1e9}), int64(3), int64(7*time.Second), int64(0), t0.UnixNano())
	f.Add(uint8(algorithms.KindSlidingWindow), encodeState(&algorithms.SlidingWindow{Start: 60, Prev: 9, Curr: 4, Period: 60}), int64(5), int64(7), int64(0), int64(100))
	f.Add(uint8(algorithms.KindSlidingLog), encodeState(logOf(10, 5, 20, 5, 30, 5)), int64(7), int64(15), int64(0), int64(25))
	f.Add(uint8(algorithms.KindGCRA), encodeState(&algorithms.GCRA{TAT: math.MaxInt64, TATFrac: 1}), int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), int64(0))
	f.Add(uint8(algorithms.KindLeakyBucket), encodeState(&algorithms.LeakyBucket{Drained: 5}), int64(0), int64(-1), int64(-1), int64(3))
	f.Add(uint8(algorithms.KindSpacing), encodeState(&algorithms.Spacing{Next: t0.Add(year).UnixNano()}), int64(1), int64(time.Second), int64(0), t0.UnixNano())
	f.Add(uint8(algorithms.KindSpacing), encodeState(&algorithms.Spacing{Next: -1}), int64(1), int64(math.MaxInt64), int64(0), int64(math.MaxInt64))
	f.Fuzz(func(t *testing.T, kind uint8, data []byte, count, period, burst, now int64) {
		if kind >= uint8(algorithms.NumKinds) || now < 0 {
			return
		}
		s := states()[kind]()
		if s.UnmarshalBinary(data) != nil {
			return
		}
		l := algorithms.Limit{Count: count, Period: time.Duration(period), Burst: burst}
		usable := l.Validate()
		if algorithms.Kind(kind) == algorithms.KindSlidingLog {
			usable = algorithms.ValidateSlidingLog(l)
		}
		before := snapshot(s)
		s.Clamp(time.Unix(0, now), l)
		if usable != nil {
			if !sameState(before, snapshot(s)) {
				t.Fatalf("Clamp under the unusable %+v changed %+v to %+v", l, before, snapshot(s))
			}
			return
		}
		if err := s.Validate(time.Unix(0, now), l, 0); err != nil {
			t.Fatalf("%+v clamped under %+v at %d to %+v: %v", before, l, now, snapshot(s), err)
		}
	})
}

func encodeState(s state) []byte {
	b, err := s.AppendBinary(nil)
	if err != nil {
		panic(err)
	}
	return b
}
