package limiter

import (
	"container/heap"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/algorithms"
)

// Reservations hold hits whose cost is known only afterwards (a language
// model's tokens, a transcode's seconds). Reserve decides a request as
// Decide does and charges its hits, but keeps them under a random id with
// a time-to-live; Settle charges the real cost, giving back what was
// reserved beyond it (algorithms' GiveBack) or charging the excess as
// forced hits; Release gives everything back. One neither settled nor
// released by its time-to-live stays charged in full, and is counted. A
// reservation lives in its key's shard, beside its counter; a settled one
// is remembered until its expiry, so that a retried Settle answers as the
// first did. Config.MaxReservations and MaxReservationsPerKey bound them,
// and they travel with their counter (travel.go). See
// docs/design-store.md, "Reservations".

// DefaultMaxReservations is the default bound on reservations held.
const DefaultMaxReservations = 100_000

// DefaultMaxReservationsPerClient is the default bound on the
// reservations one client (its TLS name, else its /24 or /64) makes
// through one node, open or settled within their time-to-live: 10% of
// DefaultMaxReservations, so that one client cannot take a node's table.
// The bound is kept by the node the client reaches (see package service's
// claims), so a client that reaches every node of a cluster of n holds at
// most n times it.
const DefaultMaxReservationsPerClient = 10_000

// ReservationMemory is what one reservation of Config.MaxReservations is
// accounted at: its entry in its shard's table, its place in the expiry
// order and its key's count (BenchmarkMemoryPerReservation measures 266).
const ReservationMemory = 272

// DefaultMaxReservationsPerKey is the default bound on the reservations
// one name and key hold, open or settled: 1% of DefaultMaxReservations,
// so that one client cannot take every reservation a node holds.
const DefaultMaxReservationsPerKey = 1_000

var (
	// ErrUnknownReservation reports a reservation id this store does not
	// hold: never made here, or past its time-to-live (when it was charged
	// in full, or, if settled, forgotten).
	ErrUnknownReservation = errors.New("reservation_id: unknown for this name and key, or expired")
	// ErrOtherCounter reports a reservation id used with a name and key
	// other than those it was made for.
	ErrOtherCounter = errors.New("reservation_id: a reservation of another name or key")
	// ErrSettled reports a second Settle of a reservation with another
	// cost than the first: a retry of the first answers as it did.
	ErrSettled = errors.New("reservation settled already")
	// ErrTooManyReservations reports a Reserve refused because the store
	// holds Config.MaxReservations reservations.
	ErrTooManyReservations = errors.New("too many reservations")
	// ErrNotReservable reports a request that cannot reserve; the error
	// names the field.
	ErrNotReservable = errors.New("cannot reserve")
)

// ReservationID names a reservation: 128 random bits, so that no one can
// guess another client's.
type ReservationID [16]byte

// String returns id in hex, its form on the wire.
func (id ReservationID) String() string { return hex.EncodeToString(id[:]) }

// ParseReservationID reads String's form.
func ParseReservationID(s string) (ReservationID, error) {
	var id ReservationID
	if len(s) != 2*len(id) {
		return id, fmt.Errorf("reservation_id: %d characters, want %d hex digits", len(s), 2*len(id))
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, fmt.Errorf("reservation_id: not hex: %w", err)
	}
	return id, nil
}

// Settlement is a Settle: the reservation, the name and key it was made
// for, and its real cost, or Release to give it all back.
type Settlement struct {
	ID        ReservationID
	Name, Key string
	// Cost is the hits really spent; ignored with Release.
	Cost    int64
	Release bool
	// Now is the time to evaluate at.
	Now time.Time
}

// Settled is the answer to a Settle.
type Settled struct {
	// Decision is the counter's state after the settle, as a check of no
	// hits answers it (Allowed is true).
	Decision algorithms.Decision
	// Limit is the limit the reservation was made under.
	Limit algorithms.Limit
	// GivenBack is the hits returned to the counter: what was reserved
	// beyond the cost, or all of it on release, of which the counter takes
	// back what they still hold there (see algorithms' GiveBack: a bucket
	// has refilled part of them as time passed); 0 if its limit has
	// changed since.
	GivenBack int64
	// Forced is the hits charged beyond the reservation: the cost's excess
	// over it. They are charged whether or not the counter has room, since
	// the work was done, but a counter is never charged below empty.
	Forced int64
	// Replayed says this answers a retry: the reservation was settled with
	// the same cost before, and nothing was charged now.
	Replayed bool
}

// reservation is what the store keeps of one.
type reservation struct {
	bind      uint64 // bindHash of the name and key it was made for
	algorithm Algorithm
	limit     algorithms.Limit
	hits      int64
	takenAt   int64 // the counter's evaluation time when the hits were charged, Unix ns
	expires   int64 // Unix ns
	settled   bool
	release   bool  // settled by a release
	keepAll   bool  // arrived from a peer, unvouched for: a settle gives nothing back (see travel.go)
	cost      int64 // the settled cost
	outcome   Settled
}

// reserved is one shard's reservations; the shard's lock guards it.
type reserved struct {
	byID   map[ReservationID]*reservation
	expiry expiryHeap
	// perKey counts the reservations in byID by their bind (name and
	// key), for Config.MaxReservationsPerKey.
	perKey map[uint64]int32
}

// add holds v under id: in byID, the expiry order and its key's count.
func (res *reserved) add(id ReservationID, v *reservation) {
	if res.byID == nil {
		res.byID = make(map[ReservationID]*reservation)
		res.perKey = make(map[uint64]int32)
	}
	res.byID[id] = v
	res.perKey[v.bind]++
	heap.Push(&res.expiry, expiring{v.expires, id})
}

// drop forgets the reservation v held under id.
func (res *reserved) drop(id ReservationID, v *reservation) {
	delete(res.byID, id)
	if n := res.perKey[v.bind]; n > 1 {
		res.perKey[v.bind] = n - 1
	} else {
		delete(res.perKey, v.bind)
	}
}

// expiring is a reservation's place in its shard's expiry order.
type expiring struct {
	at int64
	id ReservationID
}

// expiryHeap orders a shard's reservations by expiry, soonest first.
type expiryHeap []expiring

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(expiring)) }
func (h *expiryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// reservations is the store's bookkeeping of reservations over all
// shards: the per-shard tables (by shard index), their count and bound,
// the seed that binds ids to counters, and the metrics.
type reservations struct {
	shards  []reserved
	held    atomic.Int64
	max     int64
	perKey  int32 // the bound on one name and key's
	seed    maphash.Seed
	expired prometheus.Counter
	refused prometheus.Counter
	// refusedKey counts those refused by perKey.
	refusedKey prometheus.Counter
	settled    *prometheus.CounterVec
	notKept    *prometheus.CounterVec
}

// init sets up rs for a store of the given shards, and registers its
// metrics, with a gauge of how many are held, on conf.Registerer.
func (rs *reservations) init(conf Config, shards int) {
	max := conf.MaxReservations
	if max <= 0 {
		max = DefaultMaxReservations
	}
	perKey := conf.MaxReservationsPerKey
	if perKey <= 0 {
		perKey = DefaultMaxReservationsPerKey
	}
	rs.shards = make([]reserved, shards)
	rs.max = int64(max)
	rs.perKey = int32(min(perKey, max))
	rs.seed = maphash.MakeSeed()
	rs.expired = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringlimit_reservations_expired_total",
		Help: "Reservations neither settled nor released within their time-to-live, and so charged in full.",
	})
	rs.refused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringlimit_reservations_refused_total",
		Help: "Reservations refused because the node held --max-reservations reservations.",
	})
	rs.refusedKey = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringlimit_reservations_refused_per_key_total",
		Help: "Reservations refused because their name and key held --max-reservations-per-key reservations.",
	})
	rs.settled = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringlimit_reservations_settled_total",
		Help: "Reservations settled, by outcome: given_back (cost below the reservation), exact, forced (cost above it), released.",
	}, []string{"outcome"})
	rs.notKept = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringlimit_reservations_not_kept_total",
		Help: "Reservations that arrived with their counter (hand-off, replica, snapshot) and were not kept, so charged in full, by reason: max_reservations (the node held --max-reservations), per_counter (beyond the most one counter carries).",
	}, []string{"reason"})
	if reg := conf.Registerer; reg != nil {
		reg.MustRegister(rs.expired, rs.refused, rs.refusedKey, rs.settled, rs.notKept, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ringlimit_reservations",
			Help: "Reservations held by this node, open or settled and remembered until their time-to-live, at most --max-reservations.",
		}, func() float64 { return float64(rs.held.Load()) }))
	}
}

// claim counts one more reservation held, if the bound leaves room for
// it. It counts before the reservation is made, and only up to the
// bound, so that concurrent reservations in other shards never take the
// store, nor its gauge, past it.
func (rs *reservations) claim() bool {
	for {
		n := rs.held.Load()
		if n >= rs.max {
			return false
		}
		if rs.held.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// bindHash hashes a name and key with the store's secret seed: a
// reservation keeps it rather than the strings, up to 1,280 bytes, and no
// one who cannot read the seed can make another name and key match.
func (rs *reservations) bindHash(name, key string) uint64 {
	var h maphash.Hash
	h.SetSeed(rs.seed)
	h.WriteString(name)
	h.WriteByte(0) // a name holds no NUL
	h.WriteString(key)
	return h.Sum64()
}

// giving is what Reserve and Settle need of a table beyond counters.
type giving interface {
	lastAt(idx int32) int64
	giveBack(idx int32, now, takenAt int64, l algorithms.Limit, taken, n int64) bool
	markSettled(idx int32)
}

// giver is a state that can give hits back: the six algorithms.
type giver interface {
	GiveBack(now, takenAt time.Time, l algorithms.Limit, taken, n int64)
}

// Reservable reports whether a counter of algorithm a can hold
// reservations: whether its state can give hits back exactly.
func Reservable(a Algorithm) bool {
	switch a {
	case TokenBucket, GCRA, LeakyBucket, FixedWindow, SlidingWindow, SlidingLog:
		return true
	}
	return false
}

// Reserve decides r as Decide does and, if it is admitted, holds its hits
// under a new reservation that expires ttl after r.Now. A refused request
// gets no id (the zero ReservationID) and no error. It refuses, with an
// error naming the field, a request that cannot be given back exactly:
// one of an algorithm without give-back, of another Role than RoleLimit,
// with a MinInterval or ChargeRefused, of no hits, or a ttl that is not
// positive; and with ErrTooManyReservations one beyond
// Config.MaxReservations, or beyond Config.MaxReservationsPerKey of its
// name and key.
func (s *Store) Reserve(r *Request, ttl time.Duration) (algorithms.Decision, ReservationID, error) {
	var none ReservationID
	switch {
	case !Reservable(r.Algorithm):
		return algorithms.Decision{}, none, fmt.Errorf("algorithm: %s cannot give hits back: %w", r.Algorithm, ErrNotReservable)
	case r.Role != RoleLimit:
		return algorithms.Decision{}, none, fmt.Errorf("ceiling: a check that borrows cannot reserve: %w", ErrNotReservable)
	case r.MinInterval > 0:
		return algorithms.Decision{}, none, fmt.Errorf("min_interval_ms: a spacing counts requests and cannot give back: %w", ErrNotReservable)
	case r.ChargeRefused:
		return algorithms.Decision{}, none, fmt.Errorf("charge_refused: a reservation charges only admitted hits: %w", ErrNotReservable)
	case r.Hits <= 0:
		return algorithms.Decision{}, none, fmt.Errorf("hits: a reservation holds at least 1 hit, got %d: %w", r.Hits, ErrNotReservable)
	case ttl <= 0:
		return algorithms.Decision{}, none, fmt.Errorf("reserve_ttl_ms: must be positive, got %v: %w", ttl, ErrNotReservable)
	}
	rs := &s.reservations
	if rs.held.Load() >= rs.max {
		s.ExpireReservations(r.Now) // before taking a lock: it takes each
	}
	i := s.shardIndex(r.Key)
	sh, res := &s.shards[i], &rs.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.lacks(r) {
		return algorithms.Decision{}, none, ErrNotHeld
	}
	now := r.Now.UnixNano()
	s.expire(res, now)
	bind := rs.bindHash(r.Name, r.Key)
	if res.perKey[bind] >= rs.perKey {
		rs.refusedKey.Inc()
		return algorithms.Decision{}, none, fmt.Errorf("%w: name and key hold --max-reservations-per-key %d, open or settled within their time-to-live", ErrTooManyReservations, rs.perKey)
	}
	if !rs.claim() {
		rs.refused.Inc()
		return algorithms.Decision{}, none, fmt.Errorf("%w: the node holds --max-reservations %d", ErrTooManyReservations, rs.max)
	}
	d, err := s.take(sh, r)
	if err != nil || !d.Allowed {
		rs.held.Add(-1)
		return d, none, err // err: ErrFull, no room for the counter
	}
	t := sh.tables[r.Algorithm]
	id, hash := sh.counterID(r)
	var rid ReservationID
	rand.Read(rid[:]) // never fails (crypto/rand since Go 1.24)
	v := &reservation{
		bind:      bind,
		algorithm: r.Algorithm,
		limit:     r.Limit,
		hits:      r.Hits,
		takenAt:   t.(giving).lastAt(t.find(id, hash)),
		expires:   addClamped(now, ttl),
	}
	res.add(rid, v)
	return d, rid, nil
}

// Settle charges a reservation its real cost, or gives it all back with
// Release (see Settled). It answers ErrUnknownReservation for an id it
// does not hold, ErrOtherCounter for one made for another name or key,
// and, for a reservation settled already, the first answer again
// (Replayed) if the cost is the same, else ErrSettled. A negative cost is
// refused.
func (s *Store) Settle(st *Settlement) (Settled, error) {
	if !st.Release && st.Cost < 0 {
		return Settled{}, fmt.Errorf("cost: must not be negative, got %d: %w", st.Cost, ErrNotReservable)
	}
	rs := &s.reservations
	i := s.shardIndex(st.Key)
	sh, res := &s.shards[i], &rs.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := st.Now.UnixNano()
	s.expire(res, now)
	v := res.byID[st.ID]
	switch {
	case v == nil:
		return Settled{}, ErrUnknownReservation
	case v.bind != rs.bindHash(st.Name, st.Key):
		return Settled{}, ErrOtherCounter
	case v.settled && v.release == st.Release && (st.Release || v.cost == st.Cost):
		out := v.outcome
		out.Replayed = true
		return out, nil
	case v.settled && v.release:
		return Settled{}, fmt.Errorf("%w: released", ErrSettled)
	case v.settled:
		return Settled{}, fmt.Errorf("%w: with cost %d", ErrSettled, v.cost)
	}
	cost := st.Cost
	if st.Release {
		cost = 0
	}
	r := Request{Name: st.Name, Key: st.Key, Algorithm: v.algorithm, Limit: v.limit, Now: st.Now}
	out := Settled{Limit: v.limit}
	outcome := "exact"
	t := sh.tables[v.algorithm]
	switch {
	case cost < v.hits:
		outcome = "given_back"
		id, hash := sh.counterID(&r)
		if idx := t.find(id, hash); idx >= 0 && !v.keepAll && t.(giving).giveBack(idx, now, v.takenAt, v.limit, v.hits, v.hits-cost) {
			out.GivenBack = v.hits - cost
		}
	case cost > v.hits:
		outcome = "forced"
		out.Forced = cost - v.hits
		r.Hits = min(out.Forced, s.check(sh, &r, 0).Remaining)
		// As Charge: with no room for the counter (it refilled and was
		// evicted, and only debts are left), the excess is counted as
		// refused (ErrFull), not by forgiving another's debt.
		_, _ = s.take(sh, &r)
		r.Hits = 0
	}
	if st.Release {
		outcome = "released"
	}
	out.Decision = s.check(sh, &r, 0)
	out.Decision.Allowed = true
	v.settled, v.release, v.cost, v.outcome = true, st.Release, cost, out
	// Replication carries the settlement with the counter, even one that
	// charged nothing.
	id, hash := sh.counterID(&r)
	if idx := t.find(id, hash); idx >= 0 {
		t.(giving).markSettled(idx)
	}
	rs.settled.WithLabelValues(outcome).Inc()
	return out, nil
}

// expire drops the reservations of res whose time-to-live has passed by
// now (Unix ns), counting those never settled: they stay charged in full.
// The shard's lock is held.
func (s *Store) expire(res *reserved, now int64) {
	for len(res.expiry) > 0 && res.expiry[0].at <= now {
		x := heap.Pop(&res.expiry).(expiring)
		v := res.byID[x.id]
		if v == nil || v.expires != x.at {
			continue
		}
		res.drop(x.id, v)
		s.reservations.held.Add(-1)
		if !v.settled {
			s.reservations.expired.Inc()
		}
	}
}

// ExpireReservations drops every reservation whose time-to-live has
// passed by now, in every shard, and returns how many the store still
// holds. Reserve calls it when the store is full; a node calls it now and
// then, so that expired reservations are counted and their memory freed
// even in shards no reservation visits.
func (s *Store) ExpireReservations(now time.Time) int {
	ns := now.UnixNano()
	for i := range s.shards {
		s.shards[i].mu.Lock()
		s.expire(&s.reservations.shards[i], ns)
		s.shards[i].mu.Unlock()
	}
	return s.Reservations()
}

// Reservations returns the reservations held, open or settled.
func (s *Store) Reservations() int { return int(s.reservations.held.Load()) }

func (t *table[S, P]) lastAt(idx int32) int64 { return t.entries[idx].last }

// markSettled marks the counter at idx changed, for replication to carry a settle.
func (t *table[S, P]) markSettled(idx int32) { t.entries[idx].changed = true }

// giveBack gives n of the taken hits taken at takenAt under l back to the
// counter at idx at now (Unix ns), as algorithms' GiveBack bounds them,
// and reports whether it did: not if the counter's limit is no longer l,
// since a clamp to another limit may have uncounted them already.
func (t *table[S, P]) giveBack(idx int32, now, takenAt int64, l algorithms.Limit, taken, n int64) bool {
	e := &t.entries[idx]
	g, ok := any(P(&e.state)).(giver)
	if !ok || t.limit(e) != l {
		return false
	}
	before := t.footprint(idx)
	now = max(now, e.last)
	e.last = now
	g.GiveBack(time.Unix(0, now), time.Unix(0, takenAt), l, taken, n)
	e.changed = true
	t.settle(idx, before)
	return true
}
