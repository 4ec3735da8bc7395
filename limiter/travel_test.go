package limiter

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// throughRecord returns c as it arrives at another node: encoded and
// decoded, as hand-off, replication and snapshots carry it.
func throughRecord(t *testing.T, c Counter) Counter {
	t.Helper()
	b, err := c.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	var got Counter
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	return got
}

// move extracts key's counters from from and merges them into to at now,
// through the record, and returns how many reservations they carried.
func move(t *testing.T, from, to *Store, key string, now time.Time) int {
	t.Helper()
	n := 0
	for c := range from.Extract(func(k string) bool { return k == key }) {
		n += len(c.Reservations)
		if err := to.Merge(throughRecord(t, c), now, skew); err != nil {
			t.Fatalf("Merge(%s %s): %v", c.Algorithm, c.Key, err)
		}
	}
	return n
}

func settleAt(s *Store, id ReservationID, key string, cost int64, at time.Duration) (Settled, error) {
	return s.Settle(&Settlement{ID: id, Name: "llm", Key: key, Cost: cost, Now: t0.Add(at)})
}

// TestReservationMovesWithCounter: a reservation made at one store,
// whose counter is then handed off to another, is settled there, charged
// once, and a retry of that settle answers as the first; none is left at
// the first store, which no longer knows the id.
func TestReservationMovesWithCounter(t *testing.T) {
	for _, a := range reservable {
		t.Run(a.String(), func(t *testing.T) {
			from, to := New(Config{}), New(Config{})
			_, id, err := from.Reserve(reserveReq(a, "k", 6, 0), time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if n := move(t, from, to, "k", t0); n != 1 || from.Reservations() != 0 || to.Reservations() != 1 {
				t.Fatalf("moved %d reservations; held: from %d, to %d; want 1 moved, 0 and 1 held", n, from.Reservations(), to.Reservations())
			}
			if _, err := settleAt(from, id, "k", 2, 0); !errors.Is(err, ErrUnknownReservation) {
				t.Errorf("settle at the old home: %v, want ErrUnknownReservation", err)
			}
			got, err := settleAt(to, id, "k", 2, time.Millisecond)
			if err != nil || got.GivenBack != 4 || remaining(to, a, "k", time.Millisecond) != 8 {
				t.Errorf("settle for 2 at the new home: %+v, %v, remaining %d; want 4 given back, 8 remaining",
					got, err, remaining(to, a, "k", time.Millisecond))
			}
			again, err := settleAt(to, id, "k", 2, time.Millisecond)
			if err != nil || !again.Replayed || remaining(to, a, "k", time.Millisecond) != 8 {
				t.Errorf("retried settle: %+v, %v; want replayed, charged once", again, err)
			}
		})
	}
}

// TestRetriedSettleAfterMove: a reservation settled for more than it
// held, whose counter then moves, answers a retry of that settle at the
// new home as the first, charging the excess once.
func TestRetriedSettleAfterMove(t *testing.T) {
	for _, a := range reservable {
		t.Run(a.String(), func(t *testing.T) {
			from, to := New(Config{}), New(Config{})
			_, id, _ := from.Reserve(reserveReq(a, "k", 4, 0), time.Minute)
			first, err := settleAt(from, id, "k", 7, 0)
			if err != nil || first.Forced != 3 {
				t.Fatalf("settle for 7: %+v, %v", first, err)
			}
			move(t, from, to, "k", t0)
			again, err := settleAt(to, id, "k", 7, 0)
			if err != nil || !again.Replayed || again.Forced != 3 || again.Decision != first.Decision {
				t.Errorf("retry at the new home: %+v, %v; want the first answer %+v, replayed", again, err, first)
			}
			if got := remaining(to, a, "k", 0); got != 3 {
				t.Errorf("remaining after the retry: %d, want 3 (7 charged once)", got)
			}
			if _, err := settleAt(to, id, "k", 8, 0); !errors.Is(err, ErrSettled) {
				t.Errorf("another cost at the new home: %v, want ErrSettled", err)
			}
		})
	}
}

// TestReservationReplicated plays replication: the heir's replica store
// keeps the owner's counter under a key of its own (MergeUnder), sees the
// reservation made, then settled for less, and keeps the give-back,
// which merging alone (the more charged state) would undo; the owner
// dies, the heir promotes the replica (TakeOut, Restore) and a retried
// settle there charges nothing more. A second reservation, still open
// when the owner dies, is settled at the heir, once.
func TestReservationReplicated(t *testing.T) {
	for _, a := range reservable {
		t.Run(a.String(), func(t *testing.T) {
			owner, replicas, heir := New(Config{}), New(Config{}), New(Config{})
			replicate := func() {
				t.Helper()
				for c := range owner.Changed() {
					if err := replicas.MergeUnder(throughRecord(t, c), "owner\x00"+c.Key, t0, skew); err != nil {
						t.Fatal(err)
					}
				}
			}
			_, settled, _ := owner.Reserve(reserveReq(a, "k", 6, 0), time.Minute)
			_, open, _ := owner.Reserve(reserveReq(a, "k", 2, 0), time.Minute)
			replicate()
			if replicas.Reservations() != 2 {
				t.Fatalf("replica store holds %d reservations, want 2", replicas.Reservations())
			}
			if _, err := settleAt(owner, settled, "k", 1, 0); err != nil {
				t.Fatal(err)
			}
			replicate()

			// The owner dies: the heir promotes its replica.
			held := *reserveReq(a, "owner\x00k", 0, 0)
			cs := replicas.TakeOut(&held)
			for i := range cs {
				cs[i].Key = "k"
			}
			heir.Restore(cs)
			if heir.Reservations() != 2 || replicas.Reservations() != 0 {
				t.Fatalf("after promotion: heir holds %d reservations, replicas %d; want 2 and 0", heir.Reservations(), replicas.Reservations())
			}
			if got := remaining(heir, a, "k", 0); got != 7 {
				t.Errorf("heir's counter: %d remaining, want 7 (1 settled, 2 held)", got)
			}
			if got, err := settleAt(heir, settled, "k", 1, 0); err != nil || !got.Replayed || got.GivenBack != 5 {
				t.Errorf("retry at the heir: %+v, %v; want replayed, 5 given back", got, err)
			}
			if got, err := settleAt(heir, open, "k", 0, 0); err != nil || got.Replayed || got.GivenBack != 2 {
				t.Errorf("settle of the open one at the heir: %+v, %v; want 2 given back", got, err)
			}
			if got := remaining(heir, a, "k", 0); got != 9 {
				t.Errorf("heir's counter after both settles: %d remaining, want 9", got)
			}
		})
	}
}

// TestArrivingReservationsBounded: reservations arriving beyond
// MaxReservations are not kept, and counted; their hits stay charged.
// Those past their expiry are not kept either.
func TestArrivingReservationsBounded(t *testing.T) {
	from := New(Config{})
	for i := range 5 {
		if _, _, err := from.Reserve(reserveReq(TokenBucket, "k", 1, time.Duration(i)*time.Second), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	_, _, _ = from.Reserve(reserveReq(TokenBucket, "k", 1, 0), time.Second) // expires at t0+1s
	to := New(Config{MaxReservations: 3})
	if n := move(t, from, to, "k", t0.Add(5*time.Second)); n != 6 {
		t.Fatalf("moved %d reservations, want 6", n)
	}
	if to.Reservations() != 3 {
		t.Errorf("receiver holds %d reservations, want its bound 3", to.Reservations())
	}
	if n := testutil.ToFloat64(to.reservations.notKept.WithLabelValues("max_reservations")); n != 2 {
		t.Errorf("not kept for the bound: %v, want 2", n)
	}
	if n := testutil.ToFloat64(to.reservations.expired); n != 1 {
		t.Errorf("expired on arrival: %v, want 1", n)
	}
	if got := remaining(to, TokenBucket, "k", 5*time.Second); got != 4 {
		t.Errorf("receiver's counter: %d remaining, want 4 (6 charged, 0 given back)", got)
	}
}

// TestCounterCarriesBoundedReservations: a counter carries at most
// MaxCounterReservations, the open ones first; a copy (Counters) leaves
// the rest in place, a move drops and counts them.
func TestCounterCarriesBoundedReservations(t *testing.T) {
	s := New(Config{})
	big := *reserveReq(TokenBucket, "k", 1, 0)
	big.Limit.Count = 1000
	var first ReservationID
	for i := range MaxCounterReservations + 10 {
		_, id, err := s.Reserve(&big, time.Hour-time.Duration(i)*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = id
		}
	}
	// Settled, the first reservation is carried last, so not at all.
	if _, err := s.Settle(&Settlement{ID: first, Name: "llm", Key: "k", Cost: 1, Now: t0}); err != nil {
		t.Fatal(err)
	}
	for c := range s.Counters() {
		if len(c.Reservations) != MaxCounterReservations || c.Reservations[0].Settled {
			t.Fatalf("copy carries %d reservations (first settled: %v), want %d, open ones first",
				len(c.Reservations), c.Reservations[0].Settled, MaxCounterReservations)
		}
		for _, r := range c.Reservations {
			if r.ID == first {
				t.Errorf("the settled reservation was carried before open ones")
			}
		}
	}
	for c := range s.Extract(func(string) bool { return true }) {
		if len(c.Reservations) != MaxCounterReservations {
			t.Errorf("move carries %d reservations, want %d", len(c.Reservations), MaxCounterReservations)
		}
	}
	if s.Reservations() != 0 || testutil.ToFloat64(s.reservations.notKept.WithLabelValues("per_counter")) != 10 {
		t.Errorf("after the move: %d held, %v counted; want 0 held, 10 counted", s.Reservations(),
			testutil.ToFloat64(s.reservations.notKept.WithLabelValues("per_counter")))
	}
}

// TestMergeRefusesBadReservations: a counter whose reservations could not
// have been made is refused whole.
func TestMergeRefusesBadReservations(t *testing.T) {
	good := func() Counter {
		s := New(Config{})
		_, _, _ = s.Reserve(reserveReq(GCRA, "k", 3, 0), time.Minute)
		for c := range s.Counters() {
			return c
		}
		panic("no counter")
	}
	for _, tc := range []struct {
		name string
		bad  func(r *Reservation)
	}{
		{"no hits", func(r *Reservation) { r.Hits = 0 }},
		{"hits beyond capacity", func(r *Reservation) { r.Hits = 11 }},
		{"invalid limit", func(r *Reservation) { r.Limit.Count = 0 }},
		{"charged in the future", func(r *Reservation) { r.TakenAt = t0.Add(time.Hour).UnixNano() }},
		{"expires before 1970", func(r *Reservation) { r.Expires = -1 }},
		{"released with a cost", func(r *Reservation) { r.Settled, r.Release, r.Cost = true, true, 1 }},
		{"given back more than reserved", func(r *Reservation) { r.Settled, r.Cost, r.Outcome.GivenBack = true, 1, 3 }},
		{"forced not the excess", func(r *Reservation) { r.Settled, r.Cost, r.Outcome.Forced = true, 5, 1 }},
		{"negative state", func(r *Reservation) { r.Settled, r.Outcome.Decision.RetryAfter = true, -1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good()
			tc.bad(&c.Reservations[0])
			s := New(Config{})
			if err := s.Merge(c, t0, time.Second); !errors.Is(err, ErrBadCounter) || s.Len() != 0 || s.Reservations() != 0 {
				t.Errorf("Merge: %v, %d counters, %d reservations; want ErrBadCounter and nothing kept", err, s.Len(), s.Reservations())
			}
		})
	}
	c := good()
	c.Reservations = append(c.Reservations, c.Reservations[0])
	if _, err := c.AppendBinary(nil); !errors.Is(err, ErrBadCounter) {
		t.Errorf("AppendBinary of two reservations of one id: %v, want ErrBadCounter", err)
	}
	c = good()
	c.Algorithm = Spacing
	if _, err := c.AppendBinary(nil); !errors.Is(err, ErrBadCounter) {
		t.Errorf("AppendBinary of a spacing with reservations: %v, want ErrBadCounter", err)
	}
}

// TestReservationsInSnapshotWalk: Charged, which snapshots write, carries
// a charged counter's reservations, and a store loaded from it settles
// them.
func TestReservationsInSnapshotWalk(t *testing.T) {
	from, to := New(Config{}), New(Config{})
	ids := make(map[Algorithm]ReservationID)
	for _, a := range reservable {
		_, ids[a], _ = from.Reserve(reserveReq(a, "k", 5, 0), time.Minute)
	}
	n := 0
	for c := range from.Charged(t0) {
		n += len(c.Reservations)
		if err := to.Merge(throughRecord(t, c), t0, skew); err != nil {
			t.Fatal(err)
		}
	}
	if n != len(reservable) || to.Reservations() != len(reservable) {
		t.Fatalf("Charged carried %d reservations, %d kept; want %d", n, to.Reservations(), len(reservable))
	}
	for _, a := range reservable {
		if got, err := settleAt(to, ids[a], "k", 0, 0); err != nil || got.GivenBack != 5 {
			t.Errorf("%s: settle after load: %+v, %v", a, got, err)
		}
	}
}

func ExampleCounter_Reservations() {
	owner, heir := New(Config{}), New(Config{})
	r := reserveReq(TokenBucket, "user-1", 6, 0)
	_, id, _ := owner.Reserve(r, time.Minute)
	for c := range owner.Extract(func(string) bool { return true }) {
		_ = heir.Merge(c, t0, 0) // its reservation goes with it
	}
	out, err := heir.Settle(&Settlement{ID: id, Name: r.Name, Key: r.Key, Cost: 2, Now: t0})
	fmt.Println(out.GivenBack, err)
	// Output: 4 <nil>
}

// BenchmarkCountersWithReservations walks 10,000 counters, as a snapshot
// or a replication round does, without reservations and with one on
// each: the cost reservations add to a walk, reported per counter.
func BenchmarkCountersWithReservations(b *testing.B) {
	for _, reserved := range []bool{false, true} {
		b.Run(fmt.Sprint("reserved=", reserved), func(b *testing.B) {
			s := New(Config{})
			const n = 10_000
			for i := range n {
				r := reserveReq(TokenBucket, fmt.Sprint("k", i), 1, 0)
				if reserved {
					_, _, _ = s.Reserve(r, time.Hour)
				} else {
					s.Decide(r)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				for range s.Counters() {
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/counter")
		})
	}
}

// TestForgedReservationsCannotRefill: reservations a peer sends with a
// counter the store holds already give nothing back, so a member cannot
// refill a counter others spent by forging one and settling it for
// nothing; with a counter new to the store, those new here give back one
// capacity of its limit in all, no more. Replicas give back in full.
func TestForgedReservationsCannotRefill(t *testing.T) {
	forged := func(s *Store, n int, hits int64) Counter {
		t.Helper()
		for c := range s.Counters() {
			c.Reservations = nil
			for i := range n {
				c.Reservations = append(c.Reservations, Reservation{ID: ReservationID{byte(i + 1)},
					Limit: c.Limit, Hits: hits, TakenAt: t0.UnixNano(), Expires: t0.Add(time.Minute).UnixNano()})
			}
			return c
		}
		t.Fatal("no counter")
		return Counter{}
	}
	settleAll := func(s *Store, n int) (given int64) {
		for i := range n {
			got, err := settleAt(s, ReservationID{byte(i + 1)}, "k", 0, 0)
			if err != nil {
				t.Fatalf("settle of forged reservation %d: %v", i, err)
			}
			given += got.GivenBack
		}
		return given
	}

	// The store's own counter, spent, and a peer's word about it.
	victim, peer := New(Config{}), New(Config{})
	victim.Decide(reserveReq(TokenBucket, "k", 10, 0))
	peer.Decide(reserveReq(TokenBucket, "k", 10, 0))
	if err := victim.Merge(throughRecord(t, forged(peer, 3, 10)), t0, skew); err != nil {
		t.Fatal(err)
	}
	if given := settleAll(victim, 3); given != 0 || remaining(victim, TokenBucket, "k", 0) != 0 {
		t.Errorf("forged reservations on a counter held already gave back %d, %d remaining; want 0 and 0",
			given, remaining(victim, TokenBucket, "k", 0))
	}

	// A counter new here: one capacity (10) in all gives back.
	fresh := New(Config{})
	if err := fresh.Merge(throughRecord(t, forged(peer, 3, 6)), t0, skew); err != nil {
		t.Fatal(err)
	}
	if given := settleAll(fresh, 3); given != 6 {
		t.Errorf("reservations of 6, 6 and 6 with a counter of capacity 10 new here gave back %d, want 6", given)
	}

	// A replica is its sender's own: every reservation gives back.
	replica := New(Config{})
	replica.Decide(reserveReq(TokenBucket, "k", 10, 0))
	if err := replica.MergeUnder(throughRecord(t, forged(peer, 1, 10)), "k", t0, skew); err != nil {
		t.Fatal(err)
	}
	if given := settleAll(replica, 1); given != 10 {
		t.Errorf("a replica's reservation gave back %d, want 10", given)
	}
}

// TestMovedReservationsCountPerKey: reservations that leave with their
// counter no longer count against the key's --max-reservations-per-key
// where they were, and those that arrive count where they land, so a key
// cannot hold more than its bound by having its counter moved.
func TestMovedReservationsCountPerKey(t *testing.T) {
	from, to := New(Config{MaxReservationsPerKey: 2}), New(Config{MaxReservationsPerKey: 2})
	reserve := func(s *Store, at time.Duration) error {
		_, _, err := s.Reserve(reserveReq(TokenBucket, "k", 1, at), time.Minute)
		return err
	}
	for range 2 {
		if err := reserve(from, 0); err != nil {
			t.Fatal(err)
		}
	}
	if n := move(t, from, to, "k", t0); n != 2 {
		t.Fatalf("moved %d reservations, want 2", n)
	}
	if err := reserve(to, time.Millisecond); !errors.Is(err, ErrTooManyReservations) {
		t.Errorf("a third reservation where two arrived: %v, want ErrTooManyReservations", err)
	}
	for i := range 2 {
		if err := reserve(from, time.Millisecond); err != nil {
			t.Errorf("reservation %d where the two left: %v", i, err)
		}
	}
	to.ExpireReservations(t0.Add(2 * time.Minute))
	for i := range to.reservations.shards {
		if n := len(to.reservations.shards[i].perKey); n != 0 {
			t.Errorf("shard %d counts %d keys with no reservations left", i, n)
		}
	}
}
