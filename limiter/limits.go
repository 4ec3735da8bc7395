package limiter

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"

	"github.com/ringlimit/ringlimit/algorithms"
)

// limits interns the limits a table's counters were last evaluated with,
// so that an entry keeps a 4-byte index instead of its 24-byte Limit. A
// limit is held only while a counter holds it (hold, given back when the
// counter takes another or leaves the table), so Config.MaxKeys bounds
// the limits too. Index 0 is the zero Limit, always there and uncounted.
// See docs/design-store.md, "Limits interned". Not safe for concurrent
// use: the shard's lock guards it.
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
