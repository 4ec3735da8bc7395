package limiter

import (
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ringlimit/ringlimit/algorithms"
)

// state is what the store needs of an algorithm's state type S: the
// methods every type in package algorithms has, on *S.
type state[S any] interface {
	*S
	Take(now time.Time, l algorithms.Limit, n int64) algorithms.Decision
	Check(now time.Time, l algorithms.Limit, n int64) algorithms.Decision
	Merge(o S)
	AppendBinary(b []byte) ([]byte, error)
	UnmarshalBinary(data []byte) error
	Validate(now time.Time, l algorithms.Limit, skew time.Duration) error
	Clamp(now time.Time, l algorithms.Limit)
}

// entry is one counter. Entries live in a table's slice and link into the
// table's least-recently-used list by index, so that a million counters are
// a few large allocations rather than a million small ones.
//
// The instant the counter is back to full (and so can be dropped as idle)
// is not stored: it follows from state, limit and last (see fullAt), which
// saves a word per counter and means a merged state's is never taken on
// trust. Nor is the limit: the entry holds its index in the table's
// interned limits (see limits), 4 bytes where the Limit is 24.
//
// changed says the counter was charged or merged since replication last
// copied it out (see Store.Changed): take and merge set it, Changed clears
// it. It and the limit's index share the word after the LRU links, so a
// token bucket's entry is 56 bytes.
type entry[S any] struct {
	id      string // role, name and key (appendID)
	state   S
	last    int64  // latest evaluation time (Unix ns): time never runs backwards for a counter
	prev    int32  // towards the most recently used; -1 at the head
	next    int32  // towards the least recently used; -1 at the tail
	limit   uint32 // the index in the table's limits of the latest evaluation's limit, which state is valid under (see follow)
	changed bool
}

// inUse reports whether e is a counter rather than a free entry, which
// remove clears (an id is never empty: it holds at least the NUL).
func (e *entry[S]) inUse() bool { return e.id != "" }

// table maps counter ids to the counters of one algorithm, in one shard.
// It is an open-addressing hash index over a slice of entries; the index
// costs 8 bytes a slot, where a Go map would repeat the 16-byte string
// header. Not safe for concurrent use: the shard's lock guards it. What a
// decision reads (the index, the entries, the LRU ends, the log budget's
// count and the interned limits' values) comes first, in few cache lines.
type table[S any, P state[S]] struct {
	index   index // fold(xxhash of id) → entry index
	entries []entry[S]
	free    int32 // head of the free list of entries, linked by next; -1 if none
	head    int32 // most recently used, -1 if empty
	tail    int32 // least recently used, -1 if empty
	n       int   // entries in use
	logs    logBudget
	limits  limits
	bytes   *atomic.Int64 // the store's count of what its counters are accounted at (cost)
	// standIns are the hits stand-ins' checks (Request.StandIn) charged
	// to the counters at these indexes, since each last met the key's own
	// counter (Counter.StandInHits): nil until a stand-in decides here, and
	// never more entries than counters, as remove deletes them.
	standIns map[int32]int64
}

// newTable returns an empty table that accounts its counters in bytes
// (see cost).
func newTable[S any, P state[S]](bytes *atomic.Int64) *table[S, P] {
	return &table[S, P]{limits: newLimits(), free: -1, head: -1, tail: -1, bytes: bytes}
}

// cost is the bytes a counter of t whose id is idLen bytes long is
// accounted at, for Config.MaxBytes: its entry, a quarter more for the
// room the slice of entries grows into (append grows a large slice by a
// quarter, and freed entries are reused, not returned), 16 bytes of index
// (an 8-byte slot at a load between 53% and 80%: the index grows by half
// at 80%), and its id rounded up to 16 bytes (the allocator's size
// classes). The interned limits are not counted: there are at most as
// many as counters, and most counters share a few.
func (t *table[S, P]) cost(idLen int) int64 {
	var e entry[S]
	return int64(unsafe.Sizeof(e))*5/4 + 16 + int64(idLen+15)&^15
}

// limit returns the limit e was last evaluated with.
func (t *table[S, P]) limit(e *entry[S]) algorithms.Limit { return t.limits.at(e.limit) }

// setLimit makes l the limit of e, holding it in t's limits.
func (t *table[S, P]) setLimit(e *entry[S], l algorithms.Limit) { e.limit = t.limits.swap(e.limit, l) }

// fullAt returns the Unix ns at which the counter at idx is back to full:
// the ResetAfter a peek at its last evaluation reports, from then. It is
// what Take reported then, so deriving it loses nothing.
func (t *table[S, P]) fullAt(idx int32) int64 {
	e := &t.entries[idx]
	return addClamped(e.last, P(&e.state).Check(time.Unix(0, e.last), t.limit(e), 0).ResetAfter)
}

// follow makes l the limit of e, evaluated at now (Unix ns, not before
// e.last): if l is not the limit e was last evaluated with, e's state is
// clamped to what l allows at now (algorithms' Clamp), so that a check
// with another limit (a hostile one, or the application's new one) is
// decided on a state l could have left, and e's state stays valid under
// its limit at e.last, as hand-off checks. The common case, the same
// limit, costs one comparison.
func (t *table[S, P]) follow(e *entry[S], now int64, l algorithms.Limit) {
	if t.limit(e) != l {
		P(&e.state).Clamp(time.Unix(0, now), l)
		t.setLimit(e, l)
		e.last = now
	}
}

// find returns the index of the entry with the given id, or -1.
func (t *table[S, P]) find(id []byte, hash uint32) int32 {
	for idx := range t.index.candidates(hash) {
		if t.entries[idx].id == string(id) {
			return idx
		}
	}
	return -1
}

// insert adds a counter at rest for id, not yet evaluated (its limit
// the zero Limit), and returns its index. The caller has checked that id
// is absent.
func (t *table[S, P]) insert(id []byte, hash uint32, now int64) int32 {
	var idx int32
	if t.free >= 0 {
		idx = t.free
		t.free = t.entries[idx].next
		t.entries[idx] = entry[S]{id: string(id), last: now}
	} else {
		idx = int32(len(t.entries))
		t.entries = append(t.entries, entry[S]{id: string(id), last: now})
	}
	t.index.add(hash, idx, t.n)
	t.n++
	t.pushFront(idx)
	t.bytes.Add(t.cost(len(id)))
	return idx
}

// remove deletes the entry at idx, which must be in use.
func (t *table[S, P]) remove(idx int32, hash uint32) {
	t.bytes.Add(-t.cost(len(t.entries[idx].id)))
	t.index.delete(hash, idx)
	t.forget(idx)
	t.limits.release(t.entries[idx].limit)
	t.unlink(idx)
	delete(t.standIns, idx)
	t.entries[idx] = entry[S]{next: t.free}
	t.free = idx
	t.n--
}

func (t *table[S, P]) pushFront(idx int32) {
	e := &t.entries[idx]
	e.prev, e.next = -1, t.head
	if t.head >= 0 {
		t.entries[t.head].prev = idx
	}
	t.head = idx
	if t.tail < 0 {
		t.tail = idx
	}
}

func (t *table[S, P]) unlink(idx int32) {
	e := &t.entries[idx]
	if e.prev >= 0 {
		t.entries[e.prev].next = e.next
	} else {
		t.head = e.next
	}
	if e.next >= 0 {
		t.entries[e.next].prev = e.prev
	} else {
		t.tail = e.prev
	}
}

// touch marks idx as the most recently used.
func (t *table[S, P]) touch(idx int32) {
	if t.head != idx {
		t.unlink(idx)
		t.pushFront(idx)
	}
}
