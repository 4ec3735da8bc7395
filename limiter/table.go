package limiter

import (
	"time"

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
// trust.
//
// changed says the counter was charged or merged since replication last
// copied it out (see Store.Changed): take and merge set it, Changed clears
// it. With padding it costs 8 bytes a counter (a token bucket's entry is
// 80 bytes rather than 72).
type entry[S any] struct {
	id      string // role, name and key (appendID)
	state   S
	limit   algorithms.Limit // the limit of the latest evaluation, which state is valid under (see follow)
	last    int64            // latest evaluation time (Unix ns): time never runs backwards for a counter
	prev    int32            // towards the most recently used; -1 at the head
	next    int32            // towards the least recently used; -1 at the tail
	changed bool
}

// inUse reports whether e is a counter rather than a free entry, which
// remove clears (an id is never empty: it holds at least the NUL).
func (e *entry[S]) inUse() bool { return e.id != "" }

// table maps counter ids to the counters of one algorithm, in one shard.
// It is an open-addressing hash index (linear probing, backward-shift
// deletion) over a slice of entries; the index costs 8 bytes a slot, where
// a Go map would repeat the 16-byte string header. Not safe for concurrent
// use: the shard's lock guards it.
type table[S any, P state[S]] struct {
	slots   []uint64 // 0 = empty, else hash<<32 | entry index+1; the hash picks the home slot
	entries []entry[S]
	free    int32 // head of the free list of entries, linked by next; -1 if none
	head    int32 // most recently used, -1 if empty
	tail    int32 // least recently used, -1 if empty
	n       int   // entries in use
	logs    logBudget
}

const minSlots = 8

func newTable[S any, P state[S]]() *table[S, P] {
	return &table[S, P]{free: -1, head: -1, tail: -1}
}

// fullAt returns the Unix ns at which the counter at idx is back to full:
// the ResetAfter a peek at its last evaluation reports, from then. It is
// what Take reported then, so deriving it loses nothing.
func (t *table[S, P]) fullAt(idx int32) int64 {
	e := &t.entries[idx]
	return addClamped(e.last, P(&e.state).Check(time.Unix(0, e.last), e.limit, 0).ResetAfter)
}

// follow makes l the limit of e, evaluated at now (Unix ns, not before
// e.last): if l is not the limit e was last evaluated with, e's state is
// clamped to what l allows at now (algorithms' Clamp), so that a check
// with another limit (a hostile one, or the application's new one) is
// decided on a state l could have left, and e's state stays valid under
// e.limit at e.last, as hand-off checks. The common case, the same limit,
// costs one comparison.
func follow[S any, P state[S]](e *entry[S], now int64, l algorithms.Limit) {
	if e.limit != l {
		P(&e.state).Clamp(time.Unix(0, now), l)
		e.limit, e.last = l, now
	}
}

// find returns the index of the entry with the given id, or -1.
func (t *table[S, P]) find(id []byte, hash uint32) int32 {
	if len(t.slots) == 0 {
		return -1
	}
	for i := t.home(hash); ; i = t.next(i) {
		s := t.slots[i]
		if s == 0 {
			return -1
		}
		if uint32(s>>32) == hash {
			idx := int32(uint32(s)) - 1
			if t.entries[idx].id == string(id) {
				return idx
			}
		}
	}
}

// insert adds a counter at rest for id and returns its index. The caller
// has checked that id is absent.
func (t *table[S, P]) insert(id []byte, hash uint32, now int64) int32 {
	if (t.n+1)*5 > len(t.slots)*4 { // at most 80% full: tags keep long probe runs cheap
		t.grow()
	}
	var idx int32
	if t.free >= 0 {
		idx = t.free
		t.free = t.entries[idx].next
		t.entries[idx] = entry[S]{id: string(id), last: now}
	} else {
		idx = int32(len(t.entries))
		t.entries = append(t.entries, entry[S]{id: string(id), last: now})
	}
	t.place(uint64(hash)<<32 | uint64(idx+1))
	t.n++
	t.pushFront(idx)
	return idx
}

// home returns the slot a hash starts probing at. Multiplying rather than
// masking maps hashes onto any table size, so that the table can grow by
// half rather than double, which keeps its load, and memory, higher.
func (t *table[S, P]) home(hash uint32) int {
	return int(uint64(hash) * uint64(len(t.slots)) >> 32)
}

// next returns the slot after i, wrapping at the end.
func (t *table[S, P]) next(i int) int {
	if i++; i == len(t.slots) {
		return 0
	}
	return i
}

// dist returns how many slots forward from a it is to b.
func (t *table[S, P]) dist(a, b int) int {
	if b >= a {
		return b - a
	}
	return b + len(t.slots) - a
}

// place puts a slot value at the first free slot from its home.
func (t *table[S, P]) place(slot uint64) {
	for i := t.home(uint32(slot >> 32)); ; i = t.next(i) {
		if t.slots[i] == 0 {
			t.slots[i] = slot
			return
		}
	}
}

func (t *table[S, P]) grow() {
	old := t.slots
	t.slots = make([]uint64, max(minSlots, len(old)+len(old)/2))
	for _, s := range old {
		if s != 0 {
			t.place(s)
		}
	}
}

// remove deletes the entry at idx, which must be in use.
func (t *table[S, P]) remove(idx int32, hash uint32) {
	want := uint64(hash)<<32 | uint64(idx+1)
	i := t.home(hash)
	for t.slots[i] != want {
		i = t.next(i)
	}
	// Backward-shift deletion: move later members of the probe run into
	// the hole when their home slot allows it, so find needs no tombstones.
	for j := t.next(i); ; j = t.next(j) {
		s := t.slots[j]
		if s == 0 {
			break
		}
		if t.dist(t.home(uint32(s>>32)), j) >= t.dist(i, j) {
			t.slots[i] = s
			i = j
		}
	}
	t.slots[i] = 0
	t.forget(idx)
	t.unlink(idx)
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
