package limiter

import (
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// perSecond10 is the limit of the spacing timelines: 10 a second, so that
// only the spacing refuses, unless a step asks for more than 10 hits.
var perSecond10 = algorithms.Limit{Count: 10, Period: time.Second}

// spacedReq is a check of hits on key under a, 10 a second, at least
// 100ms apart, at t0+at.
func spacedReq(a Algorithm, key string, hits int64, at time.Duration) Request {
	return Request{Name: "api", Key: key, Algorithm: a, Limit: perSecond10, Hits: hits, Now: t0.Add(at),
		MinInterval: 100 * time.Millisecond}
}

// parts returns peeks at r's own counter and at its spacing counter, each
// alone: what a step must leave unchanged when it is refused.
func parts(s *Store, r Request) (own, spacing algorithms.Decision) {
	o, sp := r, r.spacing()
	o.MinInterval, o.Hits, o.Reset, sp.Hits, sp.Reset = 0, 0, false, 0, false
	return s.Check(&o), s.Check(&sp)
}

// TestSpacedTimeline plays one timeline against t0 with a spacing of 100ms
// on each of the six algorithms: a request sooner than 100ms after the
// last admitted one is refused with exactly the wait left; a refusal, by
// the spacing or by the limit, charges neither; a peek charges nothing;
// reset forgets both; a clock going back waits from the latest time.
func TestSpacedTimeline(t *testing.T) {
	const ms = time.Millisecond
	for a := range algorithms.NumPublic {
		t.Run(a.String(), func(t *testing.T) {
			s := New(Config{})
			for i, st := range []struct {
				name    string
				at      time.Duration
				hits    int64
				reset   bool
				allowed bool
				retry   time.Duration
			}{
				{"first: admitted", 0, 1, false, true, 0},
				{"at once: refused by the spacing", 0, 1, false, false, 100 * ms},
				{"a nanosecond early", 100*ms - 1, 1, false, false, 1},
				{"at the boundary: admitted", 100 * ms, 1, false, true, 0},
				{"more than the limit holds: never, and the spacing is not charged", 200 * ms, 11, false, false, algorithms.Never},
				{"a peek charges nothing", 200 * ms, 0, false, true, 0},
				{"so the spacing admits", 200 * ms, 1, false, true, 0},
				{"the clock goes back: the wait counts from the latest time", 150 * ms, 1, false, false, 100 * ms},
				{"reset forgets both", 210 * ms, 1, true, true, 0},
				{"the spacing counts from the reset request", 309 * ms, 1, false, false, ms},
				{"and admits at its end", 310 * ms, 1, false, true, 0},
			} {
				r := spacedReq(a, "u", st.hits, st.at)
				r.Reset = st.reset
				own, spacing := parts(s, r)
				d := s.Decide(&r)
				if d.Allowed != st.allowed || d.RetryAfter != st.retry {
					t.Fatalf("step %d, %s: %+v, want allowed %v, retry after %v", i, st.name, d, st.allowed, st.retry)
				}
				if ownAfter, spacingAfter := parts(s, r); !d.Allowed && (ownAfter != own || spacingAfter != spacing) {
					t.Fatalf("step %d, %s: refused, but charged: own %+v -> %+v, spacing %+v -> %+v", i, st.name, own, ownAfter, spacing, spacingAfter)
				}
			}
			// After the reset the limit counts the two requests admitted,
			// as a fresh counter given them alone does.
			fresh := New(Config{})
			for _, at := range []time.Duration{210 * ms, 310 * ms} {
				fresh.Decide(ptr(spacedReq(a, "u", 1, at)))
			}
			own, _ := parts(s, spacedReq(a, "u", 0, 310*ms))
			if want, _ := parts(fresh, spacedReq(a, "u", 0, 310*ms)); own != want {
				t.Errorf("after reset and 2 requests, the limit says %+v, want %+v", own, want)
			}
		})
	}
}

// TestSpacedRefusedByTheLimit: a request the limit refuses while the
// spacing would admit it leaves the spacing as it was, and one both refuse
// waits the longer of the two waits.
func TestSpacedRefusedByTheLimit(t *testing.T) {
	const ms = time.Millisecond
	for a := range algorithms.NumPublic {
		t.Run(a.String(), func(t *testing.T) {
			s := New(Config{})
			if d := s.Decide(ptr(spacedReq(a, "v", 10, 0))); !d.Allowed {
				t.Fatalf("10 of 10 at once: %+v", d)
			}
			for _, at := range []time.Duration{50 * ms, 150 * ms} { // the spacing refuses too, then not
				r := spacedReq(a, "v", 10, at)
				own, spacing := parts(s, r)
				alone, spaceAlone := r, r.spacing()
				alone.MinInterval = 0
				want := algorithms.LongerWait(s.Check(&alone).RetryAfter, s.Check(&spaceAlone).RetryAfter)
				d := s.Decide(&r)
				if d.Allowed || d.RetryAfter != want || d.RetryAfter < 100*ms-at {
					t.Errorf("10 more at %v: %+v, want refused after %v, the longer wait", at, d, want)
				}
				if ownAfter, spacingAfter := parts(s, r); ownAfter != own || spacingAfter != spacing {
					t.Errorf("at %v: refused, but charged: own %+v -> %+v, spacing %+v -> %+v", at, own, ownAfter, spacing, spacingAfter)
				}
			}
			if _, spacing := parts(s, spacedReq(a, "v", 0, 150*ms)); spacing.Remaining != 1 {
				t.Errorf("the spacing after the limit refused: %+v, want it free (remaining 1)", spacing)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestSpacedDecision: an admitted or refused spaced request reports its
// own limit's remaining, and is full again only when the spacing is.
func TestSpacedDecision(t *testing.T) {
	s := New(Config{})
	r := spacedReq(TokenBucket, "w", 1, 0)
	r.MinInterval = time.Second
	want := algorithms.Decision{Allowed: true, Remaining: 9, ResetAfter: time.Second} // the bucket is full in 100ms
	if d := s.Decide(&r); d != want {
		t.Errorf("admitted: %+v, want %+v", d, want)
	}
	r.Now = t0.Add(400 * time.Millisecond)
	want = algorithms.Decision{Remaining: 10, RetryAfter: 600 * time.Millisecond, ResetAfter: 600 * time.Millisecond}
	if d := s.Decide(&r); d != want {
		t.Errorf("refused by the spacing: %+v, want %+v", d, want)
	}
	if d := s.Check(&r); d != want {
		t.Errorf("Check: %+v, want %+v", d, want)
	}
}

// TestSpacingAlone: a request of kind Spacing is a spacing and nothing
// else; its MinInterval is not read.
func TestSpacingAlone(t *testing.T) {
	s := New(Config{})
	r := Request{Name: "api", Key: "k", Algorithm: Spacing, Limit: SpacingLimit(time.Second), Hits: 3, Now: t0, MinInterval: time.Hour}
	for i, want := range []algorithms.Decision{
		{Allowed: true, ResetAfter: time.Second},
		{RetryAfter: time.Second, ResetAfter: time.Second},
	} {
		if d := s.Decide(&r); d != want {
			t.Errorf("request %d: %+v, want %+v", i, d, want)
		}
	}
	if s.Len() != 1 {
		t.Errorf("%d counters, want the one spacing", s.Len())
	}
}

// TestSpacedDecideAll: the spacings of a group's requests are members of
// the group; two requests of one name share one spacing, as does a
// Spacing request of that name.
func TestSpacedDecideAll(t *testing.T) {
	s := New(Config{})
	minute := Request{Name: "minute", Key: "g", Hits: 1, Now: t0, Limit: algorithms.Limit{Count: 100, Period: time.Minute},
		MinInterval: time.Second}
	second := Request{Name: "second", Key: "g", Algorithm: GCRA, Hits: 1, Now: t0, Limit: algorithms.Limit{Count: 10, Period: time.Second}}
	group := []Request{minute, second}
	out := make([]algorithms.Decision, 2)
	s.DecideAll(group, out)
	if !out[0].Allowed || !out[1].Allowed || out[0].ResetAfter != time.Second {
		t.Fatalf("first: %+v, want both admitted, the minute's full again with its spacing", out)
	}
	for i := range group {
		group[i].Now = t0.Add(300 * time.Millisecond)
	}
	s.DecideAll(group, out)
	if out[0].Allowed || out[1].Allowed || out[0].RetryAfter != 700*time.Millisecond || out[1].RetryAfter != 700*time.Millisecond {
		t.Fatalf("300ms later: %+v, want both refused for the spacing's 700ms", out)
	}
	peek := second
	peek.Hits, peek.Now = 0, group[1].Now
	if d := s.Check(&peek); d.Remaining != 10 {
		t.Errorf("the per-second limit after a refused group: %d remaining, want 10 (nothing charged since 0)", d.Remaining)
	}

	// Three checks of one name and key: two spaced, one a spacing alone.
	// One spacing counter decides them: the first is admitted, and so all.
	t1 := t0.Add(time.Hour)
	same := []Request{
		{Name: "x", Key: "g", Hits: 1, Now: t1, Limit: perSecond10, MinInterval: time.Second},
		{Name: "x", Key: "g", Algorithm: FixedWindow, Hits: 1, Now: t1, Limit: perSecond10, MinInterval: 2 * time.Second},
		{Name: "x", Key: "g", Algorithm: Spacing, Hits: 1, Now: t1, Limit: SpacingLimit(time.Second)},
	}
	out = make([]algorithms.Decision, 3)
	s.DecideAll(same, out)
	for i, d := range out {
		if !d.Allowed {
			t.Errorf("check %d of one name and key: %+v, want admitted: one spacing for all three", i, d)
		}
	}
	for i := range same {
		same[i].Now = t1.Add(time.Second)
	}
	s.DecideAll(same, out)
	for i, d := range out {
		if !d.Allowed {
			t.Errorf("a second later, check %d: %+v, want admitted under the spacing's 1s", i, d)
		}
	}
}

// TestSpacedDecideDoesNotAllocate: deciding a spaced request allocates
// nothing either.
func TestSpacedDecideDoesNotAllocate(t *testing.T) {
	s := New(Config{})
	r := spacedReq(TokenBucket, "user:42", 1, 0)
	s.Decide(&r)
	if n := testing.AllocsPerRun(100, func() {
		r.Now = r.Now.Add(time.Millisecond)
		s.Decide(&r)
	}); n != 0 {
		t.Errorf("a spaced Decide allocates %v times per call, want 0", n)
	}
}

// TestSpacingCounterMoves: a spacing counter leaves a store as a record of
// fixed bytes, is merged by another (the later Next wins, from either
// side), and the request it spaced goes on there where it stopped. Holds
// and TakeOut see a spaced request's spacing too.
func TestSpacingCounterMoves(t *testing.T) {
	from := New(Config{})
	r := spacedReq(GCRA, "k", 1, 0)
	r.Now = time.Unix(0, 0x0102030405060708)
	from.Decide(&r)
	var moved []Counter
	for c := range from.Extract(func(string) bool { return true }) {
		if c.Algorithm == Spacing {
			b, err := c.AppendBinary(nil)
			if err != nil {
				t.Fatal(err)
			}
			next := r.Now.UnixNano() + int64(100*time.Millisecond)
			want := "01" + "06" + "0300" + hex.EncodeToString([]byte("api")) + "0100" + hex.EncodeToString([]byte("k")) +
				"0100000000000000" + "00e1f50500000000" + "0000000000000000" + "0807060504030201" +
				"0106" + fmt.Sprintf("%016x", swap(uint64(next)))
			if got := hex.EncodeToString(b); got != want {
				t.Errorf("the spacing counter's record:\n got %s\nwant %s", got, want)
			}
		}
		moved = append(moved, c)
	}
	if len(moved) != 2 {
		t.Fatalf("extracted %d counters, want the GCRA and its spacing", len(moved))
	}

	// An earlier spacing of the same counter is already there: merging
	// keeps the later Next, whichever side it comes from.
	for _, earlierFirst := range []bool{true, false} {
		to := New(Config{})
		earlier := r
		earlier.Now = r.Now.Add(-50 * time.Millisecond)
		merge := func() {
			for _, c := range moved {
				if err := to.Merge(c, r.Now, skew); err != nil {
					t.Fatal(err)
				}
			}
		}
		if !earlierFirst {
			merge()
		}
		to.Decide(&earlier)
		if earlierFirst {
			merge()
		}
		at := r
		at.Now = r.Now.Add(100*time.Millisecond - 1)
		if d := to.Decide(&at); d.Allowed || d.RetryAfter != 1 {
			t.Errorf("earlier first %v: a nanosecond before the moved spacing allows: %+v, want refused for 1ns", earlierFirst, d)
		}
		if !to.Holds(&r) {
			t.Error("Holds: false")
		}
		if out := to.TakeOut(&r); len(out) != 2 || to.Len() != 0 {
			t.Errorf("TakeOut: %d counters, %d left; want the GCRA and its spacing, none left", len(out), to.Len())
		}
	}

	// Holds sees the spacing alone too: it is a counter the request is
	// decided on.
	only := New(Config{})
	for _, c := range moved {
		if c.Algorithm == Spacing {
			only.Restore([]Counter{c})
		}
	}
	if !only.Holds(&r) {
		t.Error("Holds: false with only the spacing counter")
	}
}

// swap reverses the bytes of v: little-endian, as hex of a big-endian
// number.
func swap(v uint64) uint64 {
	var out uint64
	for range 8 {
		out = out<<8 | v&0xff
		v >>= 8
	}
	return out
}
