package limiter

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// Reservations travel with their counter: every walk that yields counters
// (Counters, Charged, Changed, Extract, TakeOut) gives each counter of
// RoleLimit its reservations in Counter.Reservations, at most
// MaxCounterReservations (the open ones first, then those expiring
// soonest), and every way counters come back in (Merge, MergeUnder,
// Restore) keeps them beside their counter, bound anew under this store's
// seed, within Config.MaxReservations (beyond it one stays charged in
// full, and is counted). A forged reservation could refill a counter by
// its give-back, so one that arrives by Merge gives back only if the store
// did not hold its counter before, and at most one capacity of its limit
// a record; replicas and Restore give back in full. One that arrives
// settled settles the one held open; expiry is wall time. See
// docs/design-store.md, "Reservations".

// MaxCounterReservations bounds the reservations one counter record
// carries, so that a record, and a decoder's allocation for it, stays
// bounded (see MaxCounterBytes).
const MaxCounterReservations = 256

// ReservationBytes is the encoded size of one Reservation.
const ReservationBytes = 16 + 3*8 + 3*8 + 1 + 7*8

// reservationFlags are the bits of a Reservation's flags byte.
const (
	flagSettled = 1 << iota
	flagRelease
)

// Reservation is one reservation as it travels in its counter's record
// (Counter.Reservations). Its name, key and algorithm are its counter's.
type Reservation struct {
	ID ReservationID
	// Limit is the limit the hits were reserved under.
	Limit algorithms.Limit
	// Hits is the hits reserved, charged in the counter's state.
	Hits int64
	// TakenAt is the counter's evaluation time when they were charged,
	// and Expires the end of the time-to-live, both Unix ns (wall time).
	TakenAt, Expires int64
	// Settled says the reservation was settled, with Release, or with
	// Cost; Outcome is then the first settle's answer, for a retry.
	Settled, Release bool
	Cost             int64
	Outcome          Settled
}

// AppendBinary appends r's encoding, ReservationBytes long, all integers
// little-endian int64: ID (16 bytes), Limit (Count, Period ns, Burst),
// Hits, TakenAt and Expires (Unix ns), a flags byte (1 settled, 2
// released; no other bit), Cost, Outcome.GivenBack, Outcome.Forced and
// Outcome.Decision (Remaining, RetryAfter, ResetAfter, Delay, ns). An open
// reservation has every field from Cost on zero. The record it goes in:
// docs/design.md, "The counter record".
func (r *Reservation) AppendBinary(b []byte) []byte {
	b = append(b, r.ID[:]...)
	b = appendInt64s(b, r.Limit.Count, int64(r.Limit.Period), r.Limit.Burst, r.Hits, r.TakenAt, r.Expires)
	var flags byte
	if r.Settled {
		flags |= flagSettled
	}
	if r.Release {
		flags |= flagRelease
	}
	b = append(b, flags)
	o := &r.Outcome
	return appendInt64s(b, r.Cost, o.GivenBack, o.Forced, o.Decision.Remaining,
		int64(o.Decision.RetryAfter), int64(o.Decision.ResetAfter), int64(o.Decision.Delay))
}

func appendInt64s(b []byte, ws ...int64) []byte {
	for _, w := range ws {
		b = binary.LittleEndian.AppendUint64(b, uint64(w))
	}
	return b
}

// UnmarshalBinary decodes AppendBinary's bytes, exactly ReservationBytes
// of them, into r. It refuses unknown flags, a release that is not
// settled, and an open reservation with any settle field set, each with
// an error wrapping ErrBadCounter that names the field. It checks no
// amount nor time: validate does.
func (r *Reservation) UnmarshalBinary(data []byte) error {
	if len(data) != ReservationBytes {
		return fmt.Errorf("reservation of %d bytes, want %d: %w", len(data), ReservationBytes, ErrBadCounter)
	}
	word := func(off int) int64 { return int64(binary.LittleEndian.Uint64(data[off:])) }
	var d Reservation
	copy(d.ID[:], data)
	d.Limit = algorithms.Limit{Count: word(16), Period: time.Duration(word(24)), Burst: word(32)}
	d.Hits, d.TakenAt, d.Expires = word(40), word(48), word(56)
	flags := data[64]
	d.Settled, d.Release = flags&flagSettled != 0, flags&flagRelease != 0
	d.Cost = word(65)
	o := &d.Outcome
	o.GivenBack, o.Forced, o.Decision.Remaining = word(73), word(81), word(89)
	o.Decision.RetryAfter, o.Decision.ResetAfter, o.Decision.Delay = time.Duration(word(97)), time.Duration(word(105)), time.Duration(word(113))
	switch {
	case flags&^(flagSettled|flagRelease) != 0:
		return fmt.Errorf("reservation flags %#x: unknown bits: %w", flags, ErrBadCounter)
	case d.Release && !d.Settled:
		return fmt.Errorf("reservation flags %#x: released but not settled: %w", flags, ErrBadCounter)
	case !d.Settled && (d.Cost != 0 || *o != Settled{}):
		return fmt.Errorf("reservation: open, yet with a cost or an outcome: %w", ErrBadCounter)
	}
	*r = d
	return nil
}

// validate checks r's amounts and times, with horizon the latest Unix ns
// a received time may name (now plus the allowed clock skew): a valid
// limit, hits in 1..its capacity, charged at no negative time nor after
// horizon, expiring at no negative time (how long after now is the
// intake's to bound: checks.MaxReserveTTL), and a settlement that one Settle could
// have given (a release of no cost; hits given back only below the
// reservation, at most the difference; forced exactly the excess; a
// state of no negative remaining nor negative durations).
func (r *Reservation) validate(horizon int64) error {
	if err := r.Limit.Validate(); err != nil {
		return fmt.Errorf("limit: %w", err)
	}
	o := &r.Outcome
	d := &o.Decision
	switch {
	case r.Hits < 1 || r.Hits > r.Limit.Capacity():
		return fmt.Errorf("hits %d outside 1..%d, the limit's capacity", r.Hits, r.Limit.Capacity())
	case r.TakenAt < 0 || r.TakenAt > horizon:
		return fmt.Errorf("charged at %d, outside [0, now+skew = %d]", r.TakenAt, horizon)
	case r.Expires < 0:
		return fmt.Errorf("expires at %d, before 1970", r.Expires)
	case !r.Settled:
		return nil
	case r.Release && r.Cost != 0:
		return fmt.Errorf("released with cost %d", r.Cost)
	case r.Cost < 0:
		return fmt.Errorf("cost %d is negative", r.Cost)
	case o.GivenBack < 0 || o.GivenBack > max(r.Hits-r.Cost, 0):
		return fmt.Errorf("given back %d, outside 0..%d (reserved %d, cost %d)", o.GivenBack, max(r.Hits-r.Cost, 0), r.Hits, r.Cost)
	case o.Forced != max(r.Cost-r.Hits, 0):
		return fmt.Errorf("forced %d, not the cost's excess %d", o.Forced, max(r.Cost-r.Hits, 0))
	case d.Remaining < 0 || d.RetryAfter < 0 || d.ResetAfter < 0 || d.Delay < 0:
		return fmt.Errorf("settled state %+v has a negative field", *d)
	}
	return nil
}

// export returns v, held under id, as it travels.
func (v *reservation) export(id ReservationID) Reservation {
	return Reservation{ID: id, Limit: v.limit, Hits: v.hits, TakenAt: v.takenAt, Expires: v.expires,
		Settled: v.settled, Release: v.release, Cost: v.cost, Outcome: v.outcome}
}

// held returns r as a store keeps it, bound by bind to a counter of
// algorithm a.
func (r *Reservation) held(bind uint64, a Algorithm) *reservation {
	out := r.Outcome
	out.Limit, out.Decision.Allowed, out.Replayed = r.Limit, true, false
	return &reservation{bind: bind, algorithm: a, limit: r.Limit, hits: r.Hits, takenAt: r.TakenAt, expires: r.Expires,
		settled: r.Settled, release: r.Release, cost: r.Cost, outcome: out}
}

// boundTo is what ties a reservation to its counter in a shard.
type boundTo struct {
	bind      uint64
	algorithm Algorithm
}

// attachReservations gives each counter of cs, just collected from shard
// i under its lock, the reservations bound to it, at most
// MaxCounterReservations (see the comment at the top of this file); with
// move, it removes them from the store. The shard's lock is held.
func (s *Store) attachReservations(i int, cs []Counter, move bool) {
	rs := &s.reservations
	res := &rs.shards[i]
	if len(res.byID) == 0 {
		return
	}
	byCounter := make(map[boundTo][]ReservationID)
	for id, v := range res.byID {
		k := boundTo{v.bind, v.algorithm}
		byCounter[k] = append(byCounter[k], id)
	}
	for j := range cs {
		c := &cs[j]
		if c.Role != RoleLimit || !Reservable(c.Algorithm) {
			continue
		}
		ids := byCounter[boundTo{rs.bindHash(c.Name, c.Key), c.Algorithm}]
		if len(ids) == 0 {
			continue
		}
		// The open ones first, then those expiring soonest: the open ones
		// still hold hits a settle may give back.
		slices.SortFunc(ids, func(a, b ReservationID) int {
			va, vb := res.byID[a], res.byID[b]
			if va.settled != vb.settled {
				if va.settled {
					return 1
				}
				return -1
			}
			return cmp.Compare(va.expires, vb.expires)
		})
		c.Reservations = make([]Reservation, 0, min(len(ids), MaxCounterReservations))
		for _, id := range ids {
			if len(c.Reservations) < MaxCounterReservations {
				c.Reservations = append(c.Reservations, res.byID[id].export(id))
			} else if !move {
				break
			} else {
				rs.notKept.WithLabelValues("per_counter").Inc()
			}
			if move {
				res.drop(id, res.byID[id]) // its expiry heap entry finds it gone
				rs.held.Add(-1)
			}
		}
	}
}

// settleArrived settles, in shard i, the reservations c brings settled
// that the shard holds open for c's counter, giving back to the counter
// what their settle gave back, before c's state is merged in (see the
// comment at the top of this file). The shard's lock is held.
func (s *Store) settleArrived(i int, c *Counter) {
	rs := &s.reservations
	res := &rs.shards[i]
	if len(c.Reservations) == 0 || len(res.byID) == 0 {
		return
	}
	sh := &s.shards[i]
	bind := rs.bindHash(c.Name, c.Key)
	for k := range c.Reservations {
		r := &c.Reservations[k]
		v := res.byID[r.ID]
		if v == nil || !r.Settled || v.settled || v.bind != bind || v.algorithm != c.Algorithm {
			continue
		}
		if n := min(r.Outcome.GivenBack, v.hits); n > 0 {
			t := sh.tables[c.Algorithm]
			id, hash := sh.counterID(&Request{Name: c.Name, Key: c.Key})
			if idx := t.find(id, hash); idx >= 0 {
				t.(giving).giveBack(idx, max(v.takenAt, c.Last), v.takenAt, v.limit, v.hits, n)
			}
		}
		*v = *r.held(bind, c.Algorithm)
	}
}

// keepReservations keeps, in shard i, the reservations c brings for its
// counter, just merged there, as of now (Unix ns): see the comment at the
// top of this file. With fresh, the counter's state before the merge was
// none of this store's (a new counter, or a replica): the reservations
// new here may give back, all of them if vouched, else those open up to
// one capacity of c's limit in all. The shard's lock is held.
func (s *Store) keepReservations(i int, c *Counter, now int64, fresh, vouched bool) {
	if len(c.Reservations) == 0 {
		return
	}
	credit := int64(0) // what reservations new here may give back in all
	switch {
	case vouched:
		credit = math.MaxInt64
	case fresh:
		credit = c.Limit.Capacity()
	}
	rs := &s.reservations
	res := &rs.shards[i]
	s.expire(res, now)
	bind := rs.bindHash(c.Name, c.Key)
	for k := range c.Reservations {
		r := &c.Reservations[k]
		switch {
		case r.Expires <= now:
			if !r.Settled {
				rs.expired.Inc()
			}
			continue
		case res.byID[r.ID] != nil: // known here already: settleArrived took its settlement
			continue
		case !rs.claim():
			rs.notKept.WithLabelValues("max_reservations").Inc()
			continue
		}
		v := r.held(bind, c.Algorithm)
		if !v.settled {
			if v.keepAll = v.hits > credit; !v.keepAll {
				credit -= v.hits
			}
		}
		res.add(r.ID, v) // counted against its key's --max-reservations-per-key too
	}
}
