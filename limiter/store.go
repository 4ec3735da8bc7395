// Package limiter is the counter store: it maps (name, key) to the state of
// one rate-limit counter and decides checks against it with package
// algorithms.
//
// The store is sharded by key, so that all limits of one entity share a
// shard (and a lock) and can be decided all-or-nothing, and so that
// concurrent checks for different keys rarely contend. Each shard holds one
// table per algorithm, so that a token bucket costs the bytes of a token
// bucket rather than of the largest state. The store is bounded: beyond
// Config.MaxKeys the least recently used counters are evicted, and beyond
// Config.MaxLogEntries the least recently used sliding logs. A table keeps
// each limit its counters hold once, and only while one holds it (see
// limits), so its limits are bounded by its counters. Counters
// that are back to full carry no information, so the store drops idle
// counters it meets at the cold end of a table as it inserts new ones,
// without any background scan.
package limiter

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/algorithms"
)

// DefaultMaxKeys is the default bound on counters held in memory.
const DefaultMaxKeys = 1_000_000

// Config configures a Store. The zero value is usable: DefaultMaxKeys
// counters, no metrics.
type Config struct {
	// MaxKeys bounds the counters held; beyond it the least recently used
	// are evicted. Zero means DefaultMaxKeys.
	MaxKeys int
	// MaxLogEntries bounds the entries of all sliding logs held, 16 bytes
	// each: a log that grows while the logs hold more evicts the least
	// recently used sliding logs of its shard (so the store may exceed it
	// by a full log, algorithms.MaxSlidingLogLimit entries, a shard). Zero
	// means DefaultMaxLogEntries.
	MaxLogEntries int
	// MaxReservations bounds the reservations held, open or settled (see
	// reserve.go); beyond it Reserve is refused. Zero means
	// DefaultMaxReservations.
	MaxReservations int
	// Registerer receives the store's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Request is one check as the store sees it: validated, with its
// evaluation time resolved.
type Request struct {
	Name, Key string
	Algorithm Algorithm
	// Role tells the counter of a check's ceiling (RoleCeiling) from the
	// check's own (RoleLimit, the zero value) of the same name, key and
	// algorithm (see Role).
	Role  Role
	Limit algorithms.Limit
	// Hits is the cost; 0 asks for the state without charging.
	Hits int64
	// Reset forgets the counter's state before deciding.
	Reset bool
	// ChargeRefused counts the hits even when the request is refused
	// (FixedWindow only: algorithms.FixedWindow.Add); other algorithms
	// ignore it, and so does a refused group (DecideAll) or a request with
	// a MinInterval, which charge nothing when refused.
	ChargeRefused bool
	// MinInterval, when positive, is the least time between two admitted
	// requests for Name and Key: the request is decided together with the
	// spacing counter (kind Spacing) of its name and key, admitted only if
	// both admit and charged in both only then (see spacing.go). It is
	// ignored on a request whose Algorithm is Spacing, which is a spacing
	// already, and by Charge.
	MinInterval time.Duration
	// Now is the time to evaluate at.
	Now time.Time
}

// Store holds counters. It is safe for concurrent use.
type Store struct {
	shards        []shard
	mask          uint64
	maxKeys       int64
	maxLogEntries int64
	held          atomic.Int64 // counters in all shards
	metrics       metrics
	// logEntries is the entries all sliding logs have room for; each
	// shard's sliding-log table adds and takes its own (see logBudget).
	logEntries atomic.Int64
	// reservations are the reservations held beside the counters, one
	// table a shard, each guarded by its shard's lock (see reserve.go).
	reservations reservations
}

// shard is one lock's worth of counters.
type shard struct {
	mu     sync.Mutex
	tables [NumAlgorithms]counters
	id     []byte // scratch for a counter's id (appendID); guarded by mu
	_      [64]byte
}

// New returns an empty store.
func New(conf Config) *Store {
	maxKeys := conf.MaxKeys
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	// About two thousand counters a shard at least, so that LRU order
	// within a shard is meaningful, and at most 256 shards, plenty for the
	// cores a node has.
	n := 1
	for n < 256 && n*2*1024 <= maxKeys {
		n *= 2
	}
	s := &Store{shards: make([]shard, n), mask: uint64(n - 1), maxKeys: int64(maxKeys)}
	maxLog := conf.MaxLogEntries
	if maxLog <= 0 {
		maxLog = DefaultMaxLogEntries
	}
	s.maxLogEntries = int64(maxLog)
	for i := range s.shards {
		logs := newTable[algorithms.SlidingLog]()
		logs.logs = logBudget{used: &s.logEntries, max: int64(maxLog), evicted: s.evictedLogs}
		s.shards[i].tables = [NumAlgorithms]counters{
			TokenBucket:   newTable[algorithms.TokenBucket](),
			GCRA:          newTable[algorithms.GCRA](),
			LeakyBucket:   newTable[algorithms.LeakyBucket](),
			FixedWindow:   newTable[algorithms.FixedWindow](),
			SlidingWindow: newTable[algorithms.SlidingWindow](),
			SlidingLog:    logs,
			Spacing:       newTable[algorithms.Spacing](),
		}
	}
	s.metrics = newMetrics(conf.Registerer, s.Len)
	s.reservations.init(conf, n)
	return s
}

// Len returns the number of counters held.
func (s *Store) Len() int { return int(s.held.Load()) }

// Bounds returns the most counters, and sliding-log entries, the store
// can hold: MaxKeys and MaxLogEntries, each exceeded by at most one
// counter, or one full log, a shard (see makeRoom and logBudget). Whoever
// keeps copies of the store's counters (snapshots) sizes its bounds by it.
func (s *Store) Bounds() (counters, logEntries int) {
	shards := len(s.shards)
	return int(s.maxKeys) + shards, int(s.maxLogEntries) + shards*algorithms.MaxSlidingLogLimit
}

func (s *Store) shard(key string) *shard {
	return &s.shards[xxhash.Sum64String(key)&s.mask]
}

// Decide decides one request and charges its hits if admitted. A request
// whose Limit is not the one its counter was last evaluated with first
// clamps the counter to what the new limit allows (see package
// algorithms' Clamp), so that a changed limit, or a hostile one, takes
// effect at once and leaves nothing the next limit cannot hold. A request
// with a MinInterval is decided together with its spacing (see
// withSpacing).
func (s *Store) Decide(r *Request) algorithms.Decision {
	sh := s.shard(r.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if r.spaced() {
		return s.decideSpaced(sh, r, true)
	}
	return s.take(sh, r)
}

// DecideAll decides requests that must be admitted together: if every one
// of them is admitted, all are charged; otherwise none is, and every
// decision is a refusal. The requests must share one Key (the caller
// groups them), so one lock covers them. out must be as long as rs.
//
// In a refused group, an item that would have passed on its own reports
// the state it has (nothing charged) and the group's longest RetryAfter.
// The spacings of requests with a MinInterval are members of the group
// too (see spaceAll).
func (s *Store) DecideAll(rs []Request, out []algorithms.Decision) {
	if len(rs) == 0 {
		return
	}
	sh := s.shard(rs[0].Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if all, spacing := spaceAll(rs); all != nil {
		ds := make([]algorithms.Decision, len(all))
		s.decideAll(sh, all, ds, true)
		for i := range rs {
			out[i] = ds[i]
			if j := spacing[i]; j >= 0 {
				out[i] = withSpacing(ds[i], ds[j])
			}
		}
		return
	}
	s.decideAll(sh, rs, out, true)
}

// decideAll is DecideAll on sh, whose lock is held, for requests without
// a MinInterval; without charge it only reports what DecideAll would
// answer, as Check does for one request.
func (s *Store) decideAll(sh *shard, rs []Request, out []algorithms.Decision, charge bool) {
	admitted := true
	var retry time.Duration
	for i := range rs {
		out[i] = sh.check(&rs[i], sharedHits(rs, i))
		if !out[i].Allowed {
			admitted = false
			retry = algorithms.LongerWait(retry, out[i].RetryAfter)
		}
	}
	if admitted {
		if charge {
			for i := range rs {
				out[i] = s.take(sh, &rs[i])
			}
		}
		return
	}
	for i := range rs {
		if out[i].Allowed {
			out[i] = sh.check(&rs[i], 0)
			out[i].Allowed = false
			out[i].RetryAfter = retry
		}
	}
}

// sharedHits returns the hits rs[i] is checked with in an all-or-nothing
// group: its own and those of the requests before it on the same counter
// (a group shares its key), which are charged before it. Checked with its
// own alone, each of two requests could fit where both do not, and the
// first would be charged while the second is refused. The scan is
// quadratic, over at most a request's items (checks.MaxItems).
func sharedHits(rs []Request, i int) int64 {
	hits := rs[i].Hits
	for j := range i {
		if rs[j].Name == rs[i].Name && rs[j].Algorithm == rs[i].Algorithm && rs[j].Role == rs[i].Role {
			hits += rs[j].Hits
		}
	}
	return hits
}

// counterID writes the id of r's counter (see appendID) into the shard's
// scratch buffer and returns it with its hash.
func (sh *shard) counterID(r *Request) ([]byte, uint32) {
	sh.id = appendID(sh.id[:0], r.Role, r.Name, r.Key)
	return sh.id, fold(xxhash.Sum64(sh.id))
}

// fold mixes a 64-bit hash into the 32 bits a table slot keeps.
func fold(h uint64) uint32 { return uint32(h>>32) ^ uint32(h) }

// take decides r against its counter in sh, creating it if needed. sh.mu
// is held.
func (s *Store) take(sh *shard, r *Request) algorithms.Decision {
	t := sh.tables[r.Algorithm]
	id, hash := sh.counterID(r)
	now := r.Now.UnixNano()
	idx := t.find(id, hash)
	if idx < 0 {
		s.makeRoom(sh, t, now)
		idx = t.insert(id, hash, now)
		s.held.Add(1)
	}
	return t.take(idx, r.Reset, now, r.Limit, r.Hits, r.ChargeRefused)
}

// evictedLogs counts n sliding logs evicted for the log budget.
func (s *Store) evictedLogs(n int) {
	s.held.Add(-int64(n))
	s.metrics.logEvictions.Add(float64(n))
}

// check reports what take would answer for n hits, charging nothing. A
// limit other than the counter's last clamps it first, as take would.
func (sh *shard) check(r *Request, n int64) algorithms.Decision {
	t := sh.tables[r.Algorithm]
	id, hash := sh.counterID(r)
	return t.check(t.find(id, hash), r.Reset, r.Now.UnixNano(), r.Limit, n)
}

// makeRoom drops idle counters at the cold end of t, and, if the store
// still holds MaxKeys counters, evicts the least recently used counter of
// sh. Eviction is LRU within a shard: keys spread evenly over shards, so
// this approximates global LRU without a global lock. (A store whose keys
// all hash to other shards may exceed MaxKeys by at most one counter a
// shard.) sh.mu is held.
func (s *Store) makeRoom(sh *shard, t counters, now int64) {
	if dropped := t.dropIdle(now, 2); dropped > 0 {
		s.held.Add(-int64(dropped))
		s.metrics.idleDropped.Add(float64(dropped))
	}
	if s.held.Load() < s.maxKeys {
		return
	}
	var oldest counters
	var oldestLast int64
	for _, c := range sh.tables {
		if last, ok := c.oldest(); ok && (oldest == nil || last < oldestLast) {
			oldest, oldestLast = c, last
		}
	}
	if oldest != nil {
		oldest.evictOldest()
		s.held.Add(-1)
		s.metrics.evictions.Inc()
	}
}

// adder is a state that can count refused hits too: FixedWindow.
type adder interface {
	Add(now time.Time, l algorithms.Limit, n int64) algorithms.Decision
}

// addOrTake is s.Add if s can add (it counts refused hits too), else
// s.Take: a request with ChargeRefused.
func addOrTake[S any, P state[S]](s P, now time.Time, l algorithms.Limit, n int64) algorithms.Decision {
	if a, ok := any(s).(adder); ok {
		return a.Add(now, l, n)
	}
	return s.Take(now, l, n)
}

// counters is what a shard needs of a table, whatever its algorithm.
type counters interface {
	find(id []byte, hash uint32) int32
	insert(id []byte, hash uint32, now int64) int32
	take(idx int32, reset bool, now int64, l algorithms.Limit, n int64, chargeRefused bool) algorithms.Decision
	check(idx int32, reset bool, now int64, l algorithms.Limit, n int64) algorithms.Decision
	dropIdle(now int64, most int) int
	oldest() (last int64, ok bool)
	evictOldest()
	snapshot(a Algorithm, out []Counter) []Counter
	charged(a Algorithm, now int64, out []Counter, states []byte) ([]Counter, []byte)
	changed(a Algorithm, out []Counter) []Counter
	markChanged(match func(key string) bool)
	extract(a Algorithm, move func(key string) bool, out []Counter) []Counter
	takeOut(a Algorithm, id []byte, hash uint32) (Counter, bool)
	validate(c *Counter, now time.Time, skew time.Duration) error
	merge(store *Store, sh *shard, c *Counter) error
}

// take decides n hits under l on the counter at idx at now (Unix ns), and
// charges them if admitted (or, with chargeRefused, if the state can count
// refused hits: addOrTake), and settles the log budget (see settle). The
// store makes this one call through the counters interface per decision,
// and the common case calls Take directly: each call and each copy of the
// decision on this path costs.
func (t *table[S, P]) take(idx int32, reset bool, now int64, l algorithms.Limit, n int64, chargeRefused bool) algorithms.Decision {
	e := &t.entries[idx]
	before := t.footprint(idx)
	if reset {
		var zero S
		e.state = zero
	}
	now = max(now, e.last)
	e.last = now
	t.follow(e, now, l)
	var d algorithms.Decision
	if chargeRefused {
		d = addOrTake[S, P](&e.state, time.Unix(0, now), l, n)
	} else {
		d = P(&e.state).Take(time.Unix(0, now), l, n)
	}
	e.changed = true
	t.touch(idx)
	t.settle(idx, before)
	return d
}

func (t *table[S, P]) check(idx int32, reset bool, now int64, l algorithms.Limit, n int64) algorithms.Decision {
	if idx >= 0 && !reset {
		e := &t.entries[idx]
		now = max(now, e.last)
		t.follow(e, now, l)
		return P(&e.state).Check(time.Unix(0, now), l, n)
	}
	var rest S
	return P(&rest).Check(time.Unix(0, now), l, n)
}

func (t *table[S, P]) dropIdle(now int64, most int) int {
	dropped := 0
	for ; dropped < most && t.tail >= 0; dropped++ {
		if t.fullAt(t.tail) > now {
			break
		}
		t.remove(t.tail, fold(xxhash.Sum64String(t.entries[t.tail].id)))
	}
	return dropped
}

func (t *table[S, P]) oldest() (int64, bool) {
	if t.tail < 0 {
		return 0, false
	}
	return t.entries[t.tail].last, true
}

func (t *table[S, P]) evictOldest() {
	t.remove(t.tail, fold(xxhash.Sum64String(t.entries[t.tail].id)))
}

// addClamped returns ns + d, saturating instead of overflowing.
func addClamped(ns int64, d time.Duration) int64 {
	if d > 0 && ns > math.MaxInt64-int64(d) {
		return math.MaxInt64
	}
	return ns + int64(d)
}

// Charge spends r.Hits of r's counter, or as many as it has left. It is
// for hits that another node already admitted (GLOBAL behaviour): they
// must be counted, not refused, and a counter never goes below empty.
// It ignores r.MinInterval: GLOBAL checks have none (package service
// refuses the combination).
func (s *Store) Charge(r *Request) algorithms.Decision {
	sh := s.shard(r.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	capped := *r
	capped.Hits = min(r.Hits, sh.check(r, 0).Remaining)
	return s.take(sh, &capped)
}

// Check answers what Decide would for r, charging nothing and creating no
// counter. Like Decide, a limit other than the one the counter was last
// evaluated with first clamps the counter to what r.Limit allows (see
// package algorithms' Clamp): that uncounts, never charges.
func (s *Store) Check(r *Request) algorithms.Decision {
	sh := s.shard(r.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if r.spaced() {
		return s.decideSpaced(sh, r, false)
	}
	return sh.check(r, r.Hits)
}
