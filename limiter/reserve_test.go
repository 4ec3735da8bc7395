package limiter

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringlimit/ringlimit/algorithms"
)

var reservable = []Algorithm{TokenBucket, GCRA, LeakyBucket, FixedWindow, SlidingWindow, SlidingLog}

// reserveReq is a request for hits of 10 a minute on algorithm a at t0+at.
func reserveReq(a Algorithm, key string, hits int64, at time.Duration) *Request {
	return &Request{Name: "llm", Key: key, Algorithm: a, Limit: algorithms.Limit{Count: 10, Period: time.Minute}, Hits: hits, Now: t0.Add(at)}
}

// remaining peeks at the counter of reserveReq.
func remaining(s *Store, a Algorithm, key string, at time.Duration) int64 {
	return s.Check(reserveReq(a, key, 0, at)).Remaining
}

// TestReservationTimelines plays a reservation of 6 hits of 10 a minute,
// with a time-to-live of 30 s, on each algorithm: settled for less, for
// more, released, retried, and expired.
func TestReservationTimelines(t *testing.T) {
	const ttl = 30 * time.Second
	for _, a := range reservable {
		t.Run(a.String(), func(t *testing.T) {
			s := New(Config{})
			reserve := func(key string) ReservationID {
				t.Helper()
				d, id, err := s.Reserve(reserveReq(a, key, 6, 0), ttl)
				if err != nil || !d.Allowed || d.Remaining != 4 || id == (ReservationID{}) {
					t.Fatalf("reserve 6: %+v, id %v, %v", d, id, err)
				}
				return id
			}
			settle := func(id ReservationID, key string, cost int64, release bool, at time.Duration) (Settled, error) {
				return s.Settle(&Settlement{ID: id, Name: "llm", Key: key, Cost: cost, Release: release, Now: t0.Add(at)})
			}

			// Held hits count against the limit: 5 more are refused.
			id := reserve("less")
			if d := s.Decide(reserveReq(a, "less", 5, 0)); d.Allowed {
				t.Errorf("5 more admitted while 6 of 10 are reserved")
			}
			got, err := settle(id, "less", 2, false, 0)
			if err != nil || got.GivenBack != 4 || got.Forced != 0 || got.Replayed || got.Decision.Remaining != 8 {
				t.Errorf("settle for 2: %+v, %v; want 4 given back, 8 remaining", got, err)
			}
			again, err := settle(id, "less", 2, false, 0)
			if err != nil || !again.Replayed || again.GivenBack != 4 || remaining(s, a, "less", 0) != 8 {
				t.Errorf("retried settle: %+v, %v, remaining %d; want the same answer, replayed, charged once", again, err, remaining(s, a, "less", 0))
			}
			if _, err := settle(id, "less", 3, false, 0); !errors.Is(err, ErrSettled) {
				t.Errorf("settle again for 3: %v, want ErrSettled", err)
			}
			if _, err := settle(id, "less", 0, true, 0); !errors.Is(err, ErrSettled) {
				t.Errorf("release after settle: %v, want ErrSettled", err)
			}

			id = reserve("more")
			got, err = settle(id, "more", 9, false, 0)
			if err != nil || got.Forced != 3 || got.GivenBack != 0 || got.Decision.Remaining != 1 {
				t.Errorf("settle for 9: %+v, %v; want 3 forced, 1 remaining", got, err)
			}
			id = reserve("forced-past-empty")
			got, err = settle(id, "forced-past-empty", 1000, false, 0)
			if err != nil || got.Forced != 994 || got.Decision.Remaining != 0 {
				t.Errorf("settle for 1000: %+v, %v; want 994 forced, the counter empty", got, err)
			}

			id = reserve("release")
			got, err = settle(id, "release", 99, true, 0)
			if err != nil || got.GivenBack != 6 || got.Decision.Remaining != 10 {
				t.Errorf("release: %+v, %v; want 6 given back, 10 remaining", got, err)
			}
			if again, err := settle(id, "release", 0, true, 0); err != nil || !again.Replayed {
				t.Errorf("retried release: %+v, %v", again, err)
			}

			id = reserve("expire")
			expired := testutil.ToFloat64(s.reservations.expired)
			if _, err := settle(id, "expire", 0, true, ttl); !errors.Is(err, ErrUnknownReservation) {
				t.Errorf("release at the time-to-live: %v, want ErrUnknownReservation", err)
			}
			if got := testutil.ToFloat64(s.reservations.expired) - expired; got != 1 {
				t.Errorf("%v reservations counted expired, want 1", got)
			}
			if got := remaining(s, a, "expire", 0); got != 4 {
				t.Errorf("remaining %d after expiry, want 4: charged in full", got)
			}
			// A settled reservation is forgotten at its time-to-live too.
			if _, err := settle(id, "less", 2, false, ttl); !errors.Is(err, ErrUnknownReservation) {
				t.Errorf("retry after the time-to-live: %v, want ErrUnknownReservation", err)
			}
		})
	}
}

// TestReserveRefusedIsNotHeld: a reservation that does not fit is refused
// as a check would be, gets no id and holds nothing.
func TestReserveRefusedIsNotHeld(t *testing.T) {
	s := New(Config{})
	d, id, err := s.Reserve(reserveReq(TokenBucket, "k", 11, 0), time.Minute)
	if err != nil || d.Allowed || d.RetryAfter != algorithms.Never || id != (ReservationID{}) || s.Reservations() != 0 {
		t.Errorf("reserve 11 of 10: %+v, %v, %v, %d held", d, id, err, s.Reservations())
	}
}

func TestReserveBadInput(t *testing.T) {
	s := New(Config{})
	spaced := reserveReq(TokenBucket, "k", 1, 0)
	spaced.MinInterval = time.Second
	charge := reserveReq(FixedWindow, "k", 1, 0)
	charge.ChargeRefused = true
	ceiling := reserveReq(TokenBucket, "k", 1, 0)
	ceiling.Role = RoleCeiling
	for _, c := range []struct {
		name  string
		r     *Request
		ttl   time.Duration
		field string
	}{
		{"spacing", &Request{Name: "n", Key: "k", Algorithm: Spacing, Limit: SpacingLimit(time.Second), Hits: 1, Now: t0}, time.Minute, "algorithm"},
		{"min interval", spaced, time.Minute, "min_interval_ms"},
		{"charge refused", charge, time.Minute, "charge_refused"},
		{"ceiling", ceiling, time.Minute, "ceiling"},
		{"no hits", reserveReq(TokenBucket, "k", 0, 0), time.Minute, "hits"},
		{"zero ttl", reserveReq(TokenBucket, "k", 1, 0), 0, "reserve_ttl_ms"},
		{"negative ttl", reserveReq(TokenBucket, "k", 1, 0), -time.Second, "reserve_ttl_ms"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := s.Reserve(c.r, c.ttl)
			if !errors.Is(err, ErrNotReservable) || len(err.Error()) < len(c.field) || err.Error()[:len(c.field)] != c.field {
				t.Errorf("Reserve: %v, want ErrNotReservable naming %s", err, c.field)
			}
		})
	}
	if s.Reservations() != 0 || s.Len() != 0 {
		t.Errorf("refused reservations left %d reservations, %d counters", s.Reservations(), s.Len())
	}
	_, id, _ := s.Reserve(reserveReq(TokenBucket, "k", 2, 0), time.Minute)
	for _, c := range []struct {
		name string
		st   Settlement
		want error
	}{
		{"negative cost", Settlement{ID: id, Name: "llm", Key: "k", Cost: -1}, ErrNotReservable},
		{"another name", Settlement{ID: id, Name: "other", Key: "k", Cost: 1}, ErrOtherCounter},
		{"another key", Settlement{ID: id, Name: "llm", Key: "k2", Cost: 1}, ErrUnknownReservation},
		{"forged id", Settlement{ID: ReservationID{1, 2, 3}, Name: "llm", Key: "k", Cost: 1}, ErrUnknownReservation},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.st.Now = t0
			if _, err := s.Settle(&c.st); !errors.Is(err, c.want) {
				t.Errorf("Settle: %v, want %v", err, c.want)
			}
		})
	}
	if got := remaining(s, TokenBucket, "k", 0); got != 8 {
		t.Errorf("remaining %d after bad settles, want 8: nothing given back", got)
	}
	for _, bad := range []string{"", "00", id.String() + "00", "zz" + id.String()[2:]} {
		if _, err := ParseReservationID(bad); err == nil {
			t.Errorf("ParseReservationID(%q) accepted", bad)
		}
	}
	if got, err := ParseReservationID(id.String()); err != nil || got != id {
		t.Errorf("ParseReservationID(String()) = %v, %v", got, err)
	}
}

// TestReservationsBounded: beyond MaxReservations Reserve is refused and
// counted, whatever a client sends, and the room expired ones held is
// used again.
func TestReservationsBounded(t *testing.T) {
	s := New(Config{MaxReservations: 100})
	l := algorithms.Limit{Count: 1_000_000, Period: time.Minute}
	refused := 0
	for i := range 10_000 {
		r := &Request{Name: "n", Key: "k" + string(rune('a'+i%26)), Algorithm: TokenBucket, Limit: l, Hits: 1, Now: t0}
		if _, _, err := s.Reserve(r, time.Minute); errors.Is(err, ErrTooManyReservations) {
			refused++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if s.Reservations() != 100 || refused != 9_900 || testutil.ToFloat64(s.reservations.refused) != 9_900 {
		t.Errorf("%d held, %d refused; want 100 and 9,900", s.Reservations(), refused)
	}
	r := &Request{Name: "n", Key: "k", Algorithm: TokenBucket, Limit: l, Hits: 1, Now: t0.Add(time.Minute)}
	if _, _, err := s.Reserve(r, time.Minute); err != nil || s.Reservations() != 1 {
		t.Errorf("reserve once the others expired: %v, %d held", err, s.Reservations())
	}
	if got := testutil.ToFloat64(s.reservations.expired); got != 100 {
		t.Errorf("%v counted expired, want 100", got)
	}
}

// TestReservationsPerKeyBounded: one name and key hold at most
// MaxReservationsPerKey reservations, open or settled within their
// time-to-live, so that it cannot take the node's MaxReservations; others
// still reserve, and the room comes back as its reservations expire.
func TestReservationsPerKeyBounded(t *testing.T) {
	s := New(Config{MaxReservations: 100, MaxReservationsPerKey: 10})
	l := algorithms.Limit{Count: 1_000_000, Period: time.Minute}
	req := func(key string, at time.Time) *Request {
		return &Request{Name: "n", Key: key, Algorithm: TokenBucket, Limit: l, Hits: 1, Now: at}
	}
	var ids []ReservationID
	refused := 0
	for range 50 {
		_, id, err := s.Reserve(req("greedy", t0), time.Minute)
		switch {
		case errors.Is(err, ErrTooManyReservations) && strings.Contains(err.Error(), "--max-reservations-per-key 10"):
			refused++
		case err != nil:
			t.Fatal(err)
		default:
			ids = append(ids, id)
		}
	}
	if len(ids) != 10 || refused != 40 || testutil.ToFloat64(s.reservations.refusedKey) != 40 || testutil.ToFloat64(s.reservations.refused) != 0 {
		t.Fatalf("%d held and %d refused for one key, want 10 and 40, counted per key", len(ids), refused)
	}
	if _, _, err := s.Reserve(req("other", t0), time.Minute); err != nil {
		t.Errorf("another key: %v", err)
	}
	if _, err := s.Settle(&Settlement{ID: ids[0], Name: "n", Key: "greedy", Cost: 1, Now: t0}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Reserve(req("greedy", t0), time.Minute); !errors.Is(err, ErrTooManyReservations) {
		t.Errorf("a settled reservation, remembered until it expires, still counts: %v", err)
	}
	if _, _, err := s.Reserve(req("greedy", t0.Add(time.Minute)), time.Minute); err != nil {
		t.Errorf("once the key's reservations expired: %v", err)
	}
	s.ExpireReservations(t0.Add(3 * time.Minute))
	for i := range s.reservations.shards {
		if n := len(s.reservations.shards[i].perKey); n != 0 {
			t.Errorf("shard %d counts %d keys with no reservations left", i, n)
		}
	}
}

// TestGiveBackNotAfterLimitChange: a counter clamped to another limit may
// have lost the reserved hits already, so nothing is given back.
func TestGiveBackNotAfterLimitChange(t *testing.T) {
	s := New(Config{})
	_, id, _ := s.Reserve(reserveReq(FixedWindow, "k", 6, 0), time.Minute)
	other := reserveReq(FixedWindow, "k", 1, 0)
	other.Limit.Count = 5
	s.Decide(other) // clamps 6 to 5, then is refused
	got, err := s.Settle(&Settlement{ID: id, Name: "llm", Key: "k", Release: true, Now: t0})
	if err != nil || got.GivenBack != 0 {
		t.Errorf("release after a limit change: %+v, %v; want nothing given back", got, err)
	}
}

// TestReservationsConcurrent: concurrent reservations of 1,000 against
// 20,000 a minute never hold more than 20 at once, and each settled for
// less lets the next one in at once. Run with -race.
func TestReservationsConcurrent(t *testing.T) {
	s := New(Config{})
	l := algorithms.Limit{Count: 20_000, Period: time.Minute}
	req := func(hits int64) *Request {
		return &Request{Name: "tokens", Key: "tenant", Algorithm: SlidingWindow, Limit: l, Hits: hits, Now: t0}
	}
	var ids []ReservationID
	for range 20 {
		_, id, err := s.Reserve(req(1000), time.Minute)
		if err != nil || id == (ReservationID{}) {
			t.Fatalf("one of the first 20 reservations refused: %v", err)
		}
		ids = append(ids, id)
	}
	if d, _, _ := s.Reserve(req(1000), time.Minute); d.Allowed {
		t.Fatal("a 21st reservation of 1,000 admitted against 20,000")
	}
	for i, id := range ids {
		if _, err := s.Settle(&Settlement{ID: id, Name: "tokens", Key: "tenant", Cost: 500, Now: t0}); err != nil {
			t.Fatal(err)
		}
		// Every two settled for 500 free 1,000: the next is in at once.
		d, _, _ := s.Reserve(req(1000), time.Minute)
		if want := i%2 == 1; d.Allowed != want {
			t.Fatalf("after %d settled for 500: reserve admitted %v, want %v", i+1, d.Allowed, want)
		}
	}
	s = New(Config{})
	var mu sync.Mutex
	held, most, admitted := 0, 0, 0
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			for range 20 {
				_, id, err := s.Reserve(req(1000), time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if id == (ReservationID{}) {
					continue
				}
				mu.Lock()
				held++
				most = max(most, held)
				admitted++
				mu.Unlock()
				// Settle for 0 of the 1,000 (work that failed at once) so
				// the window never fills with spent hits.
				mu.Lock()
				held--
				mu.Unlock()
				if _, err := s.Settle(&Settlement{ID: id, Name: "tokens", Key: "tenant", Cost: 0, Now: t0}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if most > 20 || admitted == 0 {
		t.Errorf("at most %d reservations held at once (want <= 20), %d admitted", most, admitted)
	}
}

// TestReservationsBoundConcurrent: reservations made at once over many
// keys (so many shards) never take the store past MaxReservations.
func TestReservationsBoundConcurrent(t *testing.T) {
	s := New(Config{MaxReservations: 50})
	l := algorithms.Limit{Count: 1_000_000, Period: time.Minute}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				r := &Request{Name: "n", Key: fmt.Sprint("k", g, "-", i), Algorithm: TokenBucket, Limit: l, Hits: 1, Now: t0}
				if _, _, err := s.Reserve(r, time.Minute); err != nil && !errors.Is(err, ErrTooManyReservations) {
					t.Error(err)
				}
				if n := s.Reservations(); n > 50 {
					t.Errorf("%d reservations held, above the bound of 50", n)
				}
			}
		})
	}
	wg.Wait()
	if n := s.Reservations(); n != 50 {
		t.Errorf("%d reservations held, want 50", n)
	}
}
