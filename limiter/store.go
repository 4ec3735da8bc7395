// Package limiter is the counter store: it maps (name, key) to the state of
// one rate-limit counter and decides checks against it with package
// algorithms.
//
// The store is sharded by key, so that all limits of one entity share a
// shard (and a lock) and can be decided all-or-nothing, with one table per
// algorithm a shard. It is bounded (Config.MaxKeys, Config.MaxLogEntries)
// without forgiving: counters back to full are evicted first, idle ones
// dropped as a table is used, and a spent counter evicted for room keeps
// its debt (debts.go). Counters leave and arrive as versioned records
// (Counter), merged so that merging never refills. The reasoning:
// docs/design-store.md.
package limiter

import (
	"errors"
	"hash/maphash"
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

// ErrFull reports a counter the store had no room for: it held its most
// counters (Config.MaxKeys) or counter bytes (Config.MaxBytes), or its
// sliding logs their most entries (Config.MaxLogEntries), and every
// counter it could have evicted still held spent hits. The check that
// needed the counter is refused, and nothing is charged.
var ErrFull = errors.New("no room for a new counter: the node holds its most counters (--max-keys, --max-log-entries, --memory-limit) " +
	"and every one it could evict still holds spent hits; retry when they refill")

// ErrNotHeld is the error of a check that may be decided only on a counter
// the store holds (Request.Held) when it holds none: nothing is decided.
var ErrNotHeld = errors.New("the key's counter is not held here")

// Config configures a Store. The zero value is usable: DefaultMaxKeys
// counters, no metrics.
type Config struct {
	// MaxKeys bounds the counters held; beyond it counters back to full
	// are evicted, and when none is, the least recently used, whose debt
	// is kept (see MaxDebts). Zero means DefaultMaxKeys.
	MaxKeys int
	// MaxDebts bounds the debts of counters evicted while they held spent
	// hits, DebtBytes each (see debts.go); beyond it the debt that is
	// paid soonest is forgiven. Zero means DefaultDebtsPerKey × MaxKeys.
	MaxDebts int
	// MaxBytes bounds the bytes the counters are accounted at (see
	// table.cost: entry, index slot and id), as MaxKeys bounds their
	// number; zero means no bound but MaxKeys. Sliding-log entries are
	// bounded apart, by MaxLogEntries.
	MaxBytes int64
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
	// MaxReservationsPerKey bounds the reservations of one name and key
	// held, open or settled, so that one client cannot hold them all; at
	// most MaxReservations. Zero means DefaultMaxReservationsPerKey.
	MaxReservationsPerKey int
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
	// StandIn says the check is decided here for a counter that may be
	// elsewhere: this node stands in for a key's owner it cannot reach, or
	// owns the key but stopped waiting for its counter to arrive. What it
	// charges is also counted apart (Counter.StandInHits), so that when
	// this counter and the key's own meet, in a hand-off, the store that
	// holds the key's counter adds these hits to it instead of keeping the
	// more charged of the two: both sides admitted from one starting state,
	// and only their sum is what they admitted (see Store.Merge).
	StandIn bool
	// Held says the check is decided only on a counter the store holds
	// already (see Holds), looked for under the lock that decides it:
	// without one it decides nothing, and Try, TryAll and Reserve return
	// ErrNotHeld. A key's previous owner decides a pulled check so, as a
	// hand-off round may take the counter out between its look and the
	// decision: a check decided then would start a counter afresh beside
	// the one on its way (see service.Owner.Pulled).
	Held bool
}

// Store holds counters. It is safe for concurrent use.
type Store struct {
	shards        []shard
	mask          uint64
	maxKeys       int64
	maxLogEntries int64
	maxBytes      int64        // 0: no bound
	held          atomic.Int64 // counters in all shards
	bytes         atomic.Int64 // what the counters of all shards are accounted at (table.cost)
	metrics       metrics
	// logEntries is the entries all sliding logs have room for; each
	// shard's sliding-log table adds and takes its own (see logBudget).
	logEntries atomic.Int64
	// reservations are the reservations held beside the counters, one
	// table a shard, each guarded by its shard's lock (see reserve.go).
	reservations reservations
	// debtSeed seeds debtHash; debtsHeld counts the debts of all shards.
	debtSeed  maphash.Seed
	debtsHeld atomic.Int64
}

// shard is one lock's worth of counters.
type shard struct {
	mu     sync.Mutex
	tables [NumAlgorithms]counters
	id     []byte // scratch for a counter's id (appendID); guarded by mu
	debts  debts  // of counters evicted owing (see debts.go); guarded by mu
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
	s := &Store{shards: make([]shard, n), mask: uint64(n - 1), maxKeys: int64(maxKeys), maxBytes: max(conf.MaxBytes, 0)}
	maxLog := conf.MaxLogEntries
	if maxLog <= 0 {
		maxLog = DefaultMaxLogEntries
	}
	s.maxLogEntries = int64(maxLog)
	maxDebts := conf.MaxDebts
	if maxDebts <= 0 {
		maxDebts = DefaultDebtsPerKey * maxKeys
	}
	// A shard's share of the slots, two buckets at least.
	perShard := max(2*debtWays, (maxDebts/n+debtWays-1)/debtWays*debtWays)
	s.debtSeed = maphash.MakeSeed()
	for i := range s.shards {
		s.shards[i].debts.max = perShard
		logs := newTable[algorithms.SlidingLog](&s.bytes)
		logs.logs = logBudget{used: &s.logEntries, max: int64(maxLog), evicted: s.evictedLogs}
		s.shards[i].tables = [NumAlgorithms]counters{
			TokenBucket:   newTable[algorithms.TokenBucket](&s.bytes),
			GCRA:          newTable[algorithms.GCRA](&s.bytes),
			LeakyBucket:   newTable[algorithms.LeakyBucket](&s.bytes),
			FixedWindow:   newTable[algorithms.FixedWindow](&s.bytes),
			SlidingWindow: newTable[algorithms.SlidingWindow](&s.bytes),
			SlidingLog:    logs,
			Spacing:       newTable[algorithms.Spacing](&s.bytes),
		}
	}
	s.metrics = newMetrics(conf.Registerer, s.Len, s.debtsHeld.Load)
	s.reservations.init(conf, n)
	return s
}

// Len returns the number of counters held.
func (s *Store) Len() int { return int(s.held.Load()) }

// Bounds returns the most counters, sliding-log entries and reservations
// the store can hold: MaxKeys and MaxLogEntries, each exceeded by at most
// one counter, or one full log, a shard (see makeRoom and logBudget), and
// MaxReservations. Whoever keeps copies of the store's counters
// (snapshots) sizes its bounds by it.
func (s *Store) Bounds() (counters, logEntries, reservations int) {
	shards := len(s.shards)
	return int(s.maxKeys) + shards, int(s.maxLogEntries) + shards*algorithms.MaxSlidingLogLimit, int(s.reservations.max)
}

// shardIndex returns the index of key's shard, which holds its counters
// and its reservations.
func (s *Store) shardIndex(key string) uint64 { return xxhash.Sum64String(key) & s.mask }

func (s *Store) shard(key string) *shard { return &s.shards[s.shardIndex(key)] }

// Decide decides one request and charges its hits if admitted. A request
// whose Limit is not the one its counter was last evaluated with first
// clamps the counter to what the new limit allows (see package
// algorithms' Clamp), so that a changed limit, or a hostile one, takes
// effect at once and leaves nothing the next limit cannot hold. A request
// with a MinInterval is decided together with its spacing (see
// withSpacing). A request whose counter the store has no room for is
// refused, charging nothing (Try says why: ErrFull).
func (s *Store) Decide(r *Request) algorithms.Decision {
	d, _ := s.Try(r)
	return d
}

// Try is Decide that also returns ErrFull when the request was refused
// because the store had no room for its counter (see makeRoom); the
// decision is then a refusal with RetryAfter FullRetryAfter.
func (s *Store) Try(r *Request) (algorithms.Decision, error) {
	sh := s.shard(r.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.lacks(r) {
		return algorithms.Decision{}, ErrNotHeld
	}
	if r.spaced() {
		return s.decideSpaced(sh, r, true)
	}
	return s.take(sh, r)
}

// FullRetryAfter is the RetryAfter of a check refused with ErrFull: when
// a counter of the store refills cannot be told from the new key's shard
// alone, so the client is asked to come back as an overloaded node asks.
const FullRetryAfter = time.Second

// full is the decision of a check refused with ErrFull.
var full = algorithms.Decision{RetryAfter: FullRetryAfter}

// DecideAll decides requests that must be admitted together: if every one
// of them is admitted, all are charged; otherwise none is, and every
// decision is a refusal. The requests must share one Key (the caller
// groups them), so one lock covers them. out must be as long as rs.
//
// In a refused group, an item that would have passed on its own reports
// the state it has (nothing charged) and the group's longest RetryAfter.
// The spacings of requests with a MinInterval are members of the group
// too (see spaceAll). A group one of whose counters the store has no room
// for is refused whole (TryAll says why).
func (s *Store) DecideAll(rs []Request, out []algorithms.Decision) {
	_ = s.TryAll(rs, out)
}

// TryAll is DecideAll that also returns ErrFull when the group was
// refused because the store had no room for one of its counters; every
// decision is then the refusal Try answers.
func (s *Store) TryAll(rs []Request, out []algorithms.Decision) error {
	if len(rs) == 0 {
		return nil
	}
	sh := s.shard(rs[0].Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for i := range rs {
		if sh.lacks(&rs[i]) {
			clear(out)
			return ErrNotHeld
		}
	}
	if all, spacing := spaceAll(rs); all != nil {
		ds := make([]algorithms.Decision, len(all))
		err := s.decideAll(sh, all, ds, true)
		for i := range rs {
			out[i] = ds[i]
			if j := spacing[i]; j >= 0 {
				out[i] = withSpacing(ds[i], ds[j])
			}
		}
		return err
	}
	return s.decideAll(sh, rs, out, true)
}

// decideAll is DecideAll on sh, whose lock is held, for requests without
// a MinInterval; without charge it only reports what DecideAll would
// answer, as Check does for one request. Before it charges anything it
// makes room for every counter of the group that is new (reserve), so
// that a group is charged whole or not at all.
func (s *Store) decideAll(sh *shard, rs []Request, out []algorithms.Decision, charge bool) error {
	admitted := true
	var retry time.Duration
	for i := range rs {
		out[i] = s.check(sh, &rs[i], sharedHits(rs, i))
		if !out[i].Allowed {
			admitted = false
			retry = algorithms.LongerWait(retry, out[i].RetryAfter)
		}
	}
	if admitted {
		if !charge {
			return nil
		}
		if err := s.reserve(sh, rs); err != nil {
			for i := range rs {
				out[i] = full
			}
			return err
		}
		for i := range rs {
			out[i] = s.takeReserved(sh, &rs[i])
		}
		return nil
	}
	for i := range rs {
		if out[i].Allowed {
			out[i] = s.check(sh, &rs[i], 0)
			out[i].Allowed = false
			out[i].RetryAfter = retry
		}
	}
	return nil
}

// reserve makes room in the store for the counters of rs that sh does not
// hold yet, by the rule of makeRoom, and in the sliding-log budget for
// the logs rs may grow, by the rule of logRoom, so that taking them all
// then refuses none: a group is charged whole or not at all. sh.mu is
// held.
func (s *Store) reserve(sh *shard, rs []Request) error {
	var n, bytes int64
	var first counters
	now := rs[0].Now.UnixNano()
	for i := range rs {
		t := sh.tables[rs[i].Algorithm]
		id, hash := sh.counterID(&rs[i])
		idx := t.find(id, hash)
		if rs[i].Algorithm == SlidingLog && rs[i].Hits > 0 && !t.logRoom(idx, now) {
			s.metrics.refused.Inc()
			return ErrFull
		}
		if idx < 0 {
			n++
			bytes += t.cost(len(id))
			first = t
		}
	}
	if n == 0 {
		return nil
	}
	return s.makeRoom(sh, first, now, n, bytes, rs)
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

// take decides r against its counter in sh, creating it if there is room
// (see makeRoom); a sliding log that may grow while the logs hold their
// budget is refused unless logs back to full make room (see logRoom). A
// refusal charges nothing and makes no counter. sh.mu is held.
func (s *Store) take(sh *shard, r *Request) (algorithms.Decision, error) {
	t := sh.tables[r.Algorithm]
	id, hash := sh.counterID(r)
	idx := t.find(id, hash)
	now := r.Now.UnixNano()
	if r.Algorithm == SlidingLog && r.Hits > 0 && !t.logRoom(idx, now) {
		s.metrics.refused.Inc()
		return full, ErrFull
	}
	if idx < 0 {
		if err := s.makeRoom(sh, t, now, 1, t.cost(len(id)), nil); err != nil {
			return full, err
		}
	}
	return s.takeAt(sh, t, r, id, hash, idx), nil
}

// owed returns the instant the counter of algorithm a and id, which sh
// does not hold, is back to full, if the store keeps a debt for it that
// is owed still at now (see debts.go). sh.mu is held.
func (s *Store) owed(sh *shard, a Algorithm, id []byte, now int64) (until int64, ok bool) {
	if sh.debts.held == 0 {
		return 0, false
	}
	return sh.debts.owed(s.debtHash(a, id), now)
}

// repay takes the debt of the counter of algorithm a and id out of sh's
// debts, once the counter is held again. sh.mu is held.
func (s *Store) repay(sh *shard, a Algorithm, id []byte) {
	held := sh.debts.held
	sh.debts.forget(s.debtHash(a, id))
	s.debtsHeld.Add(int64(sh.debts.held - held))
}

// debtHash is the hash a debt of the counter of algorithm a and id is
// kept under: seeded, so that no one can aim at another's buckets, and
// never 0, which marks a free slot.
func (s *Store) debtHash(a Algorithm, id []byte) uint64 {
	return debtMix(a, maphash.Bytes(s.debtSeed, id))
}

// debtHashString is debtHash of an id held as a string.
func (s *Store) debtHashString(a Algorithm, id string) uint64 {
	return debtMix(a, maphash.String(s.debtSeed, id))
}

// debtMix mixes the algorithm into h, a seeded hash of a counter's id,
// and makes it odd, so never 0.
func debtMix(a Algorithm, h uint64) uint64 { return (h ^ (uint64(a)+1)*0x9e3779b97f4a7c15) | 1 }

// takeReserved is take for a request reserve has made room for: it
// refuses nothing. sh.mu is held.
func (s *Store) takeReserved(sh *shard, r *Request) algorithms.Decision {
	t := sh.tables[r.Algorithm]
	id, hash := sh.counterID(r)
	return s.takeAt(sh, t, r, id, hash, t.find(id, hash))
}

// takeAt decides r against the counter at idx of t, in sh, or, if idx is
// -1, a new one for id, of hash hash, restored from its debt if the store
// keeps one (see debts.go). sh.mu is held, and there is room.
func (s *Store) takeAt(sh *shard, t counters, r *Request, id []byte, hash uint32, idx int32) algorithms.Decision {
	now := r.Now.UnixNano()
	if idx < 0 {
		idx = t.insert(id, hash, now)
		s.held.Add(1)
		if until, ok := s.owed(sh, r.Algorithm, id, now); ok {
			t.restore(idx, until, r.Limit)
			s.repay(sh, r.Algorithm, id)
		}
	}
	d := t.take(idx, r.Reset, now, r.Limit, r.Hits, r.ChargeRefused)
	if r.StandIn && r.Algorithm != Spacing { // a spacing's state is its last admission: the later of two is both sides'
		t.standIn(idx, r.Hits, d.Allowed, r.ChargeRefused)
	}
	return d
}

// evictedLogs counts n sliding logs evicted for the log budget.
func (s *Store) evictedLogs(n int) {
	s.held.Add(-int64(n))
	s.metrics.logEvictions.Add(float64(n))
}

// check reports what take would answer for n hits of r, in sh, charging
// nothing, of a counter restored from its debt too (see debts.go). A limit other than
// the counter's last clamps it first, as take would.
func (s *Store) check(sh *shard, r *Request, n int64) algorithms.Decision {
	t := sh.tables[r.Algorithm]
	id, hash := sh.counterID(r)
	idx := t.find(id, hash)
	now := r.Now.UnixNano()
	if idx < 0 && !r.Reset {
		if until, ok := s.owed(sh, r.Algorithm, id, now); ok {
			return t.checkOwing(until, now, r.Limit, n)
		}
	}
	return t.check(idx, r.Reset, now, r.Limit, n)
}

// makeRoom drops idle counters at the cold end of t, then makes room for
// n more counters accounted at bytes (table.cost) within MaxKeys and
// MaxBytes, evicting counters back to full at now first, which lose
// nothing (see evictFull), and when it finds none the least recently used
// counter, whose debt it keeps (evictOwing): a new key is neither refused
// nor an old debt forgiven. Counters of the group rs (nil for none) are
// not evicted. Eviction stays within sh: keys spread evenly over shards,
// so a shard holds its share of the counters, and no global lock is
// needed. Only a shard that holds no counter to evict (a store whose keys
// all hash to other shards, which may exceed MaxKeys by at most one
// counter a shard) returns ErrFull. sh.mu is held.
func (s *Store) makeRoom(sh *shard, t counters, now int64, n, bytes int64, rs []Request) error {
	if dropped := t.dropIdle(now, 2); dropped > 0 {
		s.held.Add(-int64(dropped))
		s.metrics.idleDropped.Add(float64(dropped))
	}
	for s.held.Load()+n > s.maxKeys || (s.maxBytes > 0 && s.bytes.Load()+bytes > s.maxBytes) {
		if !s.evictFull(sh, now) && !s.evictOwing(sh, now, rs) {
			s.metrics.refused.Inc()
			return ErrFull
		}
	}
	return nil
}

// evictOwing evicts the least recently used counter of one of sh's
// tables, but none of the group rs, keeping its debt until it would be
// full again (see debts.go), and reports whether it found one. sh.mu is
// held.
func (s *Store) evictOwing(sh *shard, now int64, rs []Request) bool {
	for a, t := range sh.tables {
		for range len(rs) + 1 { // pass over the group's counters, moving them to the recent end
			idx, id := t.tailID()
			if idx < 0 {
				break
			}
			if inGroup(rs, Algorithm(a), id) {
				t.touch(idx)
				continue
			}
			until := t.evictAt(idx)
			s.held.Add(-1)
			s.metrics.evictedOwing.Inc()
			held := sh.debts.held
			if sh.debts.add(s.debtHashString(Algorithm(a), id), until, now) {
				s.metrics.debtsForgiven.Inc()
			}
			s.debtsHeld.Add(int64(sh.debts.held - held))
			return true
		}
	}
	return false
}

// inGroup reports whether id, of algorithm a, is the counter of a request
// of rs.
func inGroup(rs []Request, a Algorithm, id string) bool {
	if len(rs) == 0 {
		return false
	}
	role, name, key := splitID(id)
	for i := range rs {
		if r := &rs[i]; r.Algorithm == a && r.Role == role && r.Name == name && r.Key == key {
			return true
		}
	}
	return false
}

// evictScan is how many counters evictFull examines at the cold end of
// each table before it gives up: enough that a shard with counters back
// to full rarely refuses, few enough that a shard of debts refuses a new
// key in a few hundred nanoseconds.
const evictScan = 4

// evictFull evicts one counter of sh that is back to full at now, if it
// finds one among the evictScan least recently used of each of its
// tables, and reports whether it did. A counter it examines that still
// holds spent hits moves to the recent end of its table, so that the
// next call examines others: under a flood, the search goes round the
// whole shard rather than meet the same debts again. sh.mu is held.
func (s *Store) evictFull(sh *shard, now int64) bool {
	for _, t := range sh.tables {
		if t.evictFull(now, evictScan, -1) {
			s.held.Add(-1)
			s.metrics.evictions.Inc()
			return true
		}
	}
	return false
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
	standIn(idx int32, n int64, allowed, chargeRefused bool)
	check(idx int32, reset bool, now int64, l algorithms.Limit, n int64) algorithms.Decision
	dropIdle(now int64, most int) int
	evictFull(now int64, most int, except int32) bool
	tailID() (int32, string)
	touch(idx int32)
	evictAt(idx int32) (until int64)
	restore(idx int32, until int64, l algorithms.Limit)
	checkOwing(until, now int64, l algorithms.Limit, n int64) algorithms.Decision
	cost(idLen int) int64
	logRoom(idx int32, now int64) bool
	snapshot(a Algorithm, out []Counter) []Counter
	charged(a Algorithm, now int64, out []Counter, states []byte) ([]Counter, []byte)
	changed(a Algorithm, out []Counter) []Counter
	markChanged(match func(key string) bool)
	extract(a Algorithm, move func(key string) bool, out []Counter) []Counter
	takeOut(a Algorithm, id []byte, hash uint32) (Counter, bool)
	validate(c *Counter, now time.Time, skew time.Duration) error
	merge(store *Store, sh *shard, c *Counter, now int64, room bool, mode mergeMode) error
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

// standIn counts n hits that a stand-in's check (Request.StandIn) of the
// counter at idx, just decided, charged: all of them if it was allowed,
// or if its refused hits were charged too (chargeRefused, by a state that
// counts them: addOrTake); none otherwise.
func (t *table[S, P]) standIn(idx int32, n int64, allowed, chargeRefused bool) {
	if n <= 0 {
		return
	}
	if !allowed {
		if _, adds := any(&t.entries[idx].state).(adder); !adds || !chargeRefused {
			return
		}
	}
	if t.standIns == nil {
		t.standIns = make(map[int32]int64)
	}
	t.standIns[idx] = addSaturating(t.standIns[idx], n)
}

// addSaturating returns a + b for b >= 0, saturating instead of
// overflowing.
func addSaturating(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
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

// evictFull removes the least recently used counter of t but except
// (-1: none) that is back to full at now, among the most least recently
// used, moving each examined counter still charged to the recent end, and
// reports whether it removed one (see Store.evictFull).
func (t *table[S, P]) evictFull(now int64, most int, except int32) bool {
	for range most {
		idx := t.tail
		if idx < 0 {
			return false
		}
		if idx != except && t.fullAt(idx) <= now {
			t.remove(idx, fold(xxhash.Sum64String(t.entries[idx].id)))
			return true
		}
		if idx == t.head {
			return false
		}
		t.touch(idx)
	}
	return false
}

// tailID returns the index and id of the least recently used counter of
// t, or -1.
func (t *table[S, P]) tailID() (int32, string) {
	if t.tail < 0 {
		return -1, ""
	}
	return t.tail, t.entries[t.tail].id
}

// evictAt removes the counter at idx and returns the Unix ns it would have
// been full again at (see Store.evictOwing).
func (t *table[S, P]) evictAt(idx int32) int64 {
	until := t.fullAt(idx)
	t.remove(idx, fold(xxhash.Sum64String(t.entries[idx].id)))
	return until
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
// refuses the combination). A counter the store has no room for is not
// made, and the hits are not counted (they are counted as refused, see
// ErrFull): the store forgives no old debt to count them.
func (s *Store) Charge(r *Request) algorithms.Decision {
	sh := s.shard(r.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	capped := *r
	capped.Hits = min(r.Hits, s.check(sh, r, 0).Remaining)
	d, _ := s.take(sh, &capped)
	return d
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
		d, _ := s.decideSpaced(sh, r, false) // without charge, nothing is refused for room
		return d
	}
	return s.check(sh, r, r.Hits)
}
