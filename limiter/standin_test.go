package limiter

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// summed are the algorithms whose counters add a stand-in's hits: all but
// a spacing, whose state is its last admission.
var summed = []Algorithm{TokenBucket, GCRA, LeakyBucket, FixedWindow, SlidingWindow, SlidingLog}

// decideN charges hits one at a time on s's counter of reserveReq, as a
// stand-in if standIn, and returns how many were admitted.
func decideN(s *Store, a Algorithm, hits int, standIn bool, at time.Duration) int {
	admitted := 0
	for range hits {
		r := reserveReq(a, "k", 1, at)
		r.StandIn = standIn
		if s.Decide(r).Allowed {
			admitted++
		}
	}
	return admitted
}

// split makes the state of a partition: an owner's counter charged base
// hits, copied to a stand-in (as its replica would be), then each side
// charging its own hits, the stand-in's as a stand-in.
func split(t *testing.T, a Algorithm, base, ownerHits, standInHits int) (owner, standIn *Store) {
	t.Helper()
	owner, standIn = New(Config{}), New(Config{})
	decideN(owner, a, base, false, 0)
	for c := range owner.Counters() {
		if err := standIn.Merge(throughRecord(t, c), t0, skew); err != nil {
			t.Fatal(err)
		}
	}
	if got := decideN(owner, a, ownerHits, false, time.Millisecond); got != ownerHits {
		t.Fatalf("owner admitted %d of %d", got, ownerHits)
	}
	if got := decideN(standIn, a, standInHits, true, time.Millisecond); got != standInHits {
		t.Fatalf("stand-in admitted %d of %d", got, standInHits)
	}
	return owner, standIn
}

// TestStandInHitsAddAtTheOwner: after a partition in which an owner and
// a stand-in each admitted from one starting state, the stand-in's
// counter handed to the owner adds what the stand-in admitted to the
// owner's counter: the key then admits its limit less both sides'
// admissions, not less the larger side's (a merge that keeps the more
// charged state admitted 4 more here, of a limit of 10).
func TestStandInHitsAddAtTheOwner(t *testing.T) {
	for _, a := range summed {
		t.Run(a.String(), func(t *testing.T) {
			owner, standIn := split(t, a, 2, 3, 4)
			var carried int64
			for c := range standIn.Extract(func(string) bool { return true }) {
				carried += c.StandInHits
				if err := owner.Merge(throughRecord(t, c), t0.Add(2*time.Millisecond), skew); err != nil {
					t.Fatal(err)
				}
			}
			if carried != 4 {
				t.Errorf("the stand-in's counter carried %d stand-in hits, want 4", carried)
			}
			if got := decideN(owner, a, 10, false, 3*time.Millisecond); got != 10-2-3-4 {
				t.Errorf("after the heal the owner admitted %d more, want %d (10 less 2 before, 3 and 4 on the two sides)", got, 10-2-3-4)
			}
			for c := range owner.Counters() {
				if c.StandInHits != 0 {
					t.Errorf("the owner's counter counts %d stand-in hits, want 0: it is the key's own", c.StandInHits)
				}
			}
		})
	}
}

// TestLateCounterAddsTheWaitersHits: an owner that stopped waiting for
// its key's counter, and admitted as a stand-in meanwhile, adds what it
// admitted to the counter when it arrives, which its counter then is.
func TestLateCounterAddsTheWaitersHits(t *testing.T) {
	for _, a := range summed {
		t.Run(a.String(), func(t *testing.T) {
			previous, owner := New(Config{}), New(Config{})
			decideN(previous, a, 5, false, 0)
			if got := decideN(owner, a, 3, true, time.Millisecond); got != 3 {
				t.Fatalf("admitted %d of 3 before the counter arrived", got)
			}
			move(t, previous, owner, "k", t0.Add(2*time.Millisecond))
			if got := decideN(owner, a, 10, false, 3*time.Millisecond); got != 10-5-3 {
				t.Errorf("after the counter arrived the owner admitted %d more, want %d", got, 10-5-3)
			}
			for c := range owner.Counters() {
				if c.StandInHits != 0 {
					t.Errorf("the owner's counter counts %d stand-in hits after its counter arrived, want 0", c.StandInHits)
				}
			}
		})
	}
}

// TestStandInHitsAddOnce: copies of one stand-in's counter (its replica,
// sent again each round) keep the larger count, not the sum; a counter
// that comes back undelivered keeps its count; two stand-ins' counters
// meeting add their counts, and the owner then adds both.
func TestStandInHitsAddOnce(t *testing.T) {
	a := TokenBucket
	_, standIn := split(t, a, 0, 0, 3)
	replicas := New(Config{})
	for range 3 {
		for c := range standIn.Counters() {
			if err := replicas.MergeUnder(throughRecord(t, c), "held/k", t0.Add(time.Millisecond), skew); err != nil {
				t.Fatal(err)
			}
		}
	}
	for c := range replicas.Counters() {
		if c.StandInHits != 3 {
			t.Errorf("a replica sent three times counts %d stand-in hits, want 3", c.StandInHits)
		}
	}
	var out []Counter
	for c := range standIn.Extract(func(string) bool { return true }) {
		out = append(out, c)
	}
	standIn.Restore(out)
	for c := range standIn.Counters() {
		if c.StandInHits != 3 {
			t.Errorf("a counter back from a failed hand-off counts %d stand-in hits, want 3", c.StandInHits)
		}
	}
	other := New(Config{})
	decideN(other, a, 2, true, time.Millisecond)
	move(t, standIn, other, "k", t0.Add(2*time.Millisecond))
	for c := range other.Counters() {
		if c.StandInHits != 5 {
			t.Errorf("two stand-ins' counters met: %d stand-in hits, want 5", c.StandInHits)
		}
	}
	owner := New(Config{})
	decideN(owner, a, 1, false, 0)
	move(t, other, owner, "k", t0.Add(3*time.Millisecond))
	if got := decideN(owner, a, 10, false, 4*time.Millisecond); got != 10-1-5 {
		t.Errorf("the owner admitted %d more after both stand-ins' hits, want %d", got, 10-1-5)
	}
}

// TestStandInHitsPastTheirEffect: hits a stand-in admitted in a window
// that has ended are not charged to the owner's counter in the next: what
// the stand-in's counter no longer holds charged is not added.
func TestStandInHitsPastTheirEffect(t *testing.T) {
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	owner, standIn := New(Config{}), New(Config{})
	r := &Request{Name: "llm", Key: "k", Algorithm: FixedWindow, Limit: l, Hits: 6, Now: t0, StandIn: true}
	standIn.Decide(r)
	later := t0.Add(time.Minute + time.Second)
	owner.Decide(&Request{Name: "llm", Key: "k", Algorithm: FixedWindow, Limit: l, Hits: 1, Now: later})
	move(t, standIn, owner, "k", later)
	if got := owner.Check(&Request{Name: "llm", Key: "k", Algorithm: FixedWindow, Limit: l, Now: later}).Remaining; got != 9 {
		t.Errorf("remaining %d in the next window, want 9: the stand-in's 6 were in the window before", got)
	}
}

// TestForgedStandInHits: a peer's record that claims stand-in hits
// charges the owner's counter at most what its own state holds charged,
// never below empty, and never refills it.
func TestForgedStandInHits(t *testing.T) {
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	for _, tc := range []struct {
		name           string
		forgedSpent    int64 // what the forged state holds charged
		want           int64 // the owner's remaining after the merge; it had 7
		forgedHitsOver int64
	}{
		{"an empty state charges nothing", 0, 7, 1 << 62},
		{"charges at most what its state holds", 2, 5, 1 << 62},
		{"never below empty", 10, 0, 1 << 62},
	} {
		t.Run(tc.name, func(t *testing.T) {
			owner, forger := New(Config{}), New(Config{})
			owner.Decide(&Request{Name: "llm", Key: "k", Algorithm: TokenBucket, Limit: l, Hits: 3, Now: t0})
			forger.Decide(&Request{Name: "llm", Key: "k", Algorithm: TokenBucket, Limit: l, Hits: tc.forgedSpent, Now: t0})
			for c := range forger.Counters() {
				c.StandInHits = tc.forgedHitsOver
				if err := owner.Merge(throughRecord(t, c), t0, skew); err != nil {
					t.Fatal(err)
				}
			}
			if got := owner.Check(&Request{Name: "llm", Key: "k", Algorithm: TokenBucket, Limit: l, Now: t0}).Remaining; got != tc.want {
				t.Errorf("remaining %d after the forged record, want %d", got, tc.want)
			}
		})
	}
}

// TestStandInHitsComeBack: the three ways counters come back into the
// store they left, or a copy is taken as the store's own. Copies that
// could not be delivered (Remark) change nothing, their count included; a
// key's own counter that could not be handed off (Restore) takes in what a
// stand-in decided here while it was away, which is then no longer
// counted apart; a replica taken as this store's own (Promote) merges as
// a copy, adding nothing, since it may descend from the counter here.
func TestStandInHitsComeBack(t *testing.T) {
	a := TokenBucket
	hitsOf := func(s *Store) int64 {
		var n int64
		for c := range s.Counters() {
			n += c.StandInHits
		}
		return n
	}

	_, standIn := split(t, a, 1, 0, 3)
	var copies []Counter
	for c := range standIn.Changed() {
		copies = append(copies, c)
	}
	standIn.Remark(copies)
	standIn.Remark(copies)
	if got, left := hitsOf(standIn), remaining(standIn, a, "k", time.Millisecond); got != 3 || left != 6 {
		t.Errorf("after two Remarks of its copies: %d stand-in hits, %d left; want 3 and 6, unchanged", got, left)
	}
	if n := len(collect(standIn.Changed())); n != 1 {
		t.Errorf("Changed yields %d counters after Remark, want 1", n)
	}

	own := New(Config{})
	decideN(own, a, 4, false, 0)
	out := collect(own.Extract(func(string) bool { return true }))
	decideN(own, a, 2, true, time.Millisecond) // decided while its counter was away
	own.Restore(out)
	if got, left := hitsOf(own), remaining(own, a, "k", 2*time.Millisecond); got != 0 || left != 4 {
		t.Errorf("the key's own counter restored: %d stand-in hits, %d left; want 0 and 4 (its 4 and the 2 decided meanwhile)", got, left)
	}

	// A counter that went to another node, was charged there, and comes
	// back as that node's replica: it holds the hits this store's counter
	// counted apart already, which must not be added again.
	heir := New(Config{})
	decideN(heir, a, 3, true, 0)
	away := New(Config{})
	move(t, heir, away, "k", t0)
	decideN(away, a, 1, false, time.Millisecond)
	replica := collect(away.Counters())
	decideN(heir, a, 2, true, time.Millisecond) // a counter of its own meanwhile
	heir.Promote(replica)
	if got, left := hitsOf(heir), remaining(heir, a, "k", 2*time.Millisecond); got != 3 || left != 6 {
		t.Errorf("a replica of a counter that left promoted back: %d stand-in hits, %d left; want 3 and 6 (the copy's 4 charged, nothing added)", got, left)
	}
}

func collect(seq func(func(Counter) bool)) []Counter {
	var out []Counter
	for c := range seq {
		c.State = append([]byte(nil), c.State...)
		out = append(out, c)
	}
	return out
}

// TestStandInHitsUnderTheLaterLimit: a stand-in decides a key first on
// its share of the limit (the service's fallback: limit / members) and,
// once its ring drops the owner, on the whole limit, on the same counter.
// Two counters of the key that meet under two such limits, one charged
// under the share and one later under the whole, add their hits under the
// limit the merged counter keeps (the later one), not under the share the
// other was charged by, which the share's hits had used up: a counter put
// back after a hand-off round failed (Restore), beside one made under the
// whole limit while it was away, lost the hits made meanwhile, and so did
// a stand-in's counter arriving at another stand-in's (mergeMeet). After
// the merge the key admits no more than one counter that decided every hit
// in order would (for a sliding log or a window, exactly the limit less
// all of them; a bucket charged full under the share is empty under the
// whole limit too). And the key's own counter meeting a stand-in's
// charged later under the share keeps the whole limit: clamped to the
// share, it had admitted again what it had admitted (keptLimit).
func TestStandInHitsUnderTheLaterLimit(t *testing.T) {
	share := algorithms.Limit{Count: 10, Period: time.Hour}
	whole := algorithms.Limit{Count: 40, Period: time.Hour}
	decide := func(s *Store, a Algorithm, l algorithms.Limit, hits int, at time.Duration) {
		for range hits {
			s.Decide(&Request{Name: "llm", Key: "k", Algorithm: a, Limit: l, Hits: 1, Now: t0.Add(at), StandIn: true})
		}
	}
	left := func(s *Store, a Algorithm) int64 {
		return s.Check(&Request{Name: "llm", Key: "k", Algorithm: a, Limit: whole, Now: t0.Add(time.Second)}).Remaining
	}
	for _, a := range summed {
		t.Run(a.String(), func(t *testing.T) {
			one := New(Config{}) // one counter deciding every hit in order
			decide(one, a, share, 10, 0)
			decide(one, a, whole, 5, time.Millisecond)
			want := left(one, a)
			if a == SlidingLog && want != 40-15 {
				t.Fatalf("one counter: %d left, want %d", want, 40-15)
			}

			back := New(Config{})
			decide(back, a, share, 10, 0)
			away := collect(back.Extract(func(string) bool { return true }))
			decide(back, a, whole, 5, time.Millisecond) // while its counter was away
			back.Restore(away)
			if got := left(back, a); got > want {
				t.Errorf("restored beside a counter made meanwhile under the whole limit: %d left, want at most %d", got, want)
			}

			here, arriving := New(Config{}), New(Config{})
			decide(here, a, share, 10, 0)
			decide(arriving, a, whole, 5, time.Millisecond)
			move(t, arriving, here, "k", t0.Add(time.Second))
			if got := left(here, a); got > want {
				t.Errorf("a stand-in's counter under the whole limit met one under the share: %d left, want at most %d", got, want)
			}

			// The key's own counter, 25 admitted under the whole limit,
			// meets a stand-in's charged 6 under the share later: it keeps
			// the whole limit, not the share it would be clamped to.
			owner, standIn := New(Config{}), New(Config{})
			for range 25 {
				owner.Decide(&Request{Name: "llm", Key: "k", Algorithm: a, Limit: whole, Hits: 1, Now: t0})
			}
			decide(standIn, a, share, 6, time.Millisecond)
			move(t, standIn, owner, "k", t0.Add(time.Second))
			if got := left(owner, a); got > 40-25-6 {
				t.Errorf("the owner's counter met a stand-in's under the share: %d left, want at most %d", got, 40-25-6)
			}
		})
	}
}

// TestForgedStandInLimitKeepsTheOwners: a peer's record that claims
// stand-in hits under another limit (one hit an hour), evaluated later
// than the owner's counter, does not bring that limit onto the owner's
// counter: clamped to it, the owner's counter would forget what it had
// admitted, and the key admit it again.
func TestForgedStandInLimitKeepsTheOwners(t *testing.T) {
	l := algorithms.Limit{Count: 10, Period: time.Hour}
	tiny := algorithms.Limit{Count: 1, Period: time.Hour}
	for _, a := range summed {
		t.Run(a.String(), func(t *testing.T) {
			owner, forger := New(Config{}), New(Config{})
			owner.Decide(&Request{Name: "llm", Key: "k", Algorithm: a, Limit: l, Hits: 8, Now: t0})
			forger.Decide(&Request{Name: "llm", Key: "k", Algorithm: a, Limit: tiny, Hits: 1, Now: t0.Add(time.Second), StandIn: true})
			move(t, forger, owner, "k", t0.Add(2*time.Second))
			if got := owner.Check(&Request{Name: "llm", Key: "k", Algorithm: a, Limit: l, Now: t0.Add(3 * time.Second)}).Remaining; got > 2 {
				t.Errorf("remaining %d after the forged record, want at most 2: the owner's 8 forgotten", got)
			}
		})
	}
}
