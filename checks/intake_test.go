package checks

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
)

// TestIntakeTakesOnlyWhatACheckCouldMake: a counter from outside the node
// is taken only if a check could have made it, in identity, limit, time
// and state; each refusal names its record and says why.
func TestIntakeTakesOnlyWhatACheckCouldMake(t *testing.T) {
	counterOf := func(r limiter.Request) limiter.Counter {
		s := limiter.New(limiter.Config{})
		s.Decide(&r)
		for c := range s.Counters() {
			return c
		}
		t.Fatalf("no counter for %+v", r)
		return limiter.Counter{}
	}
	good := counterOf(limiter.Request{Name: "api", Key: "k", Algorithm: limiter.TokenBucket,
		Limit: algorithms.Limit{Count: 10, Period: time.Minute}, Hits: 1, Now: t0})
	reserved := func() limiter.Counter {
		s := limiter.New(limiter.Config{})
		_, _, err := s.Reserve(&limiter.Request{Name: "api", Key: "k", Algorithm: limiter.TokenBucket,
			Limit: algorithms.Limit{Count: 10, Period: time.Minute}, Hits: 3, Now: t0}, MaxReserveTTL)
		if err != nil {
			t.Fatal(err)
		}
		for c := range s.Counters() {
			return c
		}
		t.Fatal("no counter")
		return limiter.Counter{}
	}()
	withReservation := func(mutate func(r *limiter.Reservation)) func(*limiter.Counter) {
		return func(c *limiter.Counter) {
			*c = reserved
			c.Reservations = append([]limiter.Reservation(nil), reserved.Reservations...)
			mutate(&c.Reservations[0])
		}
	}
	spacing := counterOf(limiter.Request{Name: "api", Key: "k", Algorithm: limiter.Spacing,
		Limit: limiter.SpacingLimit(time.Second), Hits: 1, Now: t0})
	cases := []struct {
		name   string
		mutate func(*limiter.Counter)
		want   peerpb.Refusal_Reason // -1: taken
	}{
		{"a check's counter", func(*limiter.Counter) {}, -1},
		{"a spacing of one request an interval", func(c *limiter.Counter) { *c = spacing }, -1},
		{"limit over MaxLimit", func(c *limiter.Counter) { c.Limit.Count = MaxLimit + 1 }, peerpb.Refusal_INVALID},
		{"period not whole milliseconds", func(c *limiter.Counter) { c.Limit.Period = time.Minute + 1 }, peerpb.Refusal_INVALID},
		{"period over MaxDuration", func(c *limiter.Counter) { c.Limit.Period = MaxDuration + time.Millisecond }, peerpb.Refusal_INVALID},
		{"sliding log over its bound", func(c *limiter.Counter) {
			c.Algorithm, c.Limit.Count = limiter.SlidingLog, algorithms.MaxSlidingLogLimit+1
		}, peerpb.Refusal_INVALID},
		{"a spacing of another limit", func(c *limiter.Counter) {
			*c = spacing
			c.Limit.Count = 2
		}, peerpb.Refusal_INVALID},
		{"evaluated past the clock's skew", func(c *limiter.Counter) { c.Last = t0.Add(2 * skew).UnixNano() }, peerpb.Refusal_INVALID},
		{"a reservation of a day", withReservation(func(*limiter.Reservation) {}), -1},
		{"a reservation expiring past a day and the skew", withReservation(func(r *limiter.Reservation) {
			r.Expires = t0.Add(MaxReserveTTL + 2*skew).UnixNano()
		}), peerpb.Refusal_INVALID},
		{"a reservation settled for more than MaxLimit", withReservation(func(r *limiter.Reservation) {
			r.Settled, r.Cost, r.Outcome.Forced = true, MaxLimit+1, MaxLimit+1-r.Hits
		}), peerpb.Refusal_INVALID},
		{"a reservation under a limit over MaxLimit", withReservation(func(r *limiter.Reservation) { r.Limit.Count = MaxLimit + 1 }), peerpb.Refusal_INVALID},
		{"a reservation charged past the clock's skew", withReservation(func(r *limiter.Reservation) {
			r.TakenAt = t0.Add(2 * skew).UnixNano()
		}), peerpb.Refusal_INVALID},
	}
	in := Intake{MaxClockSkew: skew}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			counter := good
			c.mutate(&counter)
			record, err := counter.AppendBinary(nil)
			if err != nil {
				t.Fatal(err)
			}
			store := limiter.New(limiter.Config{})
			refused := in.Merge(store, []*peerpb.CounterState{{Counter: []byte("not a counter")}, {Counter: record}}, t0)
			if len(refused) == 0 || refused[0].GetIndex() != 0 || refused[0].GetReason() != peerpb.Refusal_INVALID {
				t.Fatalf("refusals %v: want the first record refused as INVALID", refused)
			}
			switch {
			case c.want < 0 && (len(refused) != 1 || store.Len() != 1):
				t.Errorf("refused %v, the store holds %d; want the counter taken", refused[1:], store.Len())
			case c.want >= 0 && (len(refused) != 2 || refused[1].GetIndex() != 1 || refused[1].GetReason() != c.want || store.Len() != 0):
				t.Errorf("refused %v, the store holds %d; want the counter refused as %v", refused, store.Len(), c.want)
			}
		})
	}
}
