package limiter

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"

	"github.com/ringlimit/ringlimit/algorithms"
)

// limits interns the limits a table's counters were last evaluated with.
// An entry keeps a 4-byte index into it instead of its 24-byte Limit:
// most counters of a name share one limit, or a handful, so a million
// token buckets are 24 bytes a counter smaller, and the smaller entry
// also costs decisions fewer cache misses.
//
// It holds a limit only while a counter of its table holds it: each
// counter holds one reference (hold), given back when the counter takes
// another limit or leaves the table (evicted, dropped idle, handed off,
// taken out), and a limit that no counter holds is forgotten at once and
// its index reused. So a table never interns more limits than it has
// counters, and Config.MaxKeys bounds both: a client that sends a
// million distinct limits for one key leaves one of them interned, and
// one that sends them for a million keys makes a million counters, which
// the store evicts beyond MaxKeys as it evicts any counters.
//
// Index 0 is the zero Limit, the limit of a counter not yet evaluated
// (a new entry, whose zero value holds it). It is always there and
// uncounted, so that a table's entries need no reference to make one.
// Not safe for concurrent use: the shard's lock guards it.
type limits struct {
	vals  []algorithms.Limit // by index; the zero Limit at 0 and at free indexes
	uses  []int32            // counters holding each index, 0 when free
	free  []uint32           // indexes to reuse
	index index              // hashLimit → index
	last  uint32             // the latest limit held, tried first
}

// newLimits returns limits holding only the zero Limit, at index 0.
func newLimits() limits {
	return limits{vals: []algorithms.Limit{{}}, uses: []int32{0}}
}

// at returns the limit at index i.
func (ls *limits) at(i uint32) algorithms.Limit { return ls.vals[i] }

// held returns how many limits are interned, the zero Limit aside.
func (ls *limits) held() int { return len(ls.vals) - 1 - len(ls.free) }

// swap gives back the counter's reference to the limit at index old and
// returns the index of l, which it now holds: interned anew if no
// counter held it.
func (ls *limits) swap(old uint32, l algorithms.Limit) uint32 {
	i := ls.hold(l)
	ls.release(old)
	return i
}

// hold returns the index of l, interning it if it is new, and counts one
// more counter holding it. It allocates only when the table has more
// distinct limits than it ever had.
func (ls *limits) hold(l algorithms.Limit) uint32 {
	if l == (algorithms.Limit{}) {
		return 0
	}
	if ls.vals[ls.last] != l {
		ls.last = ls.find(l)
	}
	ls.uses[ls.last]++
	return ls.last
}

// find returns the index of l, interning it if no counter holds it.
func (ls *limits) find(l algorithms.Limit) uint32 {
	hash := hashLimit(l)
	for i := range ls.index.candidates(hash) {
		if ls.vals[i] == l {
			return uint32(i)
		}
	}
	return ls.add(l, hash)
}

// add interns l, of hash hashLimit(l), at a free index, and returns it.
func (ls *limits) add(l algorithms.Limit, hash uint32) uint32 {
	held := ls.held()
	var i uint32
	if n := len(ls.free); n > 0 {
		i, ls.free = ls.free[n-1], ls.free[:n-1]
		ls.vals[i] = l
	} else {
		i = uint32(len(ls.vals))
		ls.vals = append(ls.vals, l)
		ls.uses = append(ls.uses, 0)
	}
	ls.index.add(hash, int32(i), held)
	return i
}

// release gives back one counter's reference to the limit at index i,
// and forgets the limit when no counter holds it any more.
func (ls *limits) release(i uint32) {
	if i == 0 {
		return
	}
	if ls.uses[i]--; ls.uses[i] > 0 {
		return
	}
	ls.index.delete(hashLimit(ls.vals[i]), int32(i))
	ls.vals[i] = algorithms.Limit{}
	ls.free = append(ls.free, i)
}

// hashLimit hashes the three words of l.
func hashLimit(l algorithms.Limit) uint32 {
	var b [24]byte
	binary.LittleEndian.PutUint64(b[0:], uint64(l.Count))
	binary.LittleEndian.PutUint64(b[8:], uint64(l.Period))
	binary.LittleEndian.PutUint64(b[16:], uint64(l.Burst))
	return fold(xxhash.Sum64(b[:]))
}
