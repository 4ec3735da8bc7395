package limiter

import "iter"

// index is an open-addressing hash index (linear probing, backward-shift
// deletion, so no tombstones) from 32-bit hashes to positions in a slice
// its owner keeps: a table's entries, or its interned limits. A slot is 8
// bytes, hash<<32 | position+1, 0 when empty; the hash in the slot lets a
// lookup skip most positions without reading what is there, and the
// owner compares what is at the position, so the index needs no copy of
// the keys. Not safe for concurrent use: its owner's lock guards it.
type index struct {
	slots []uint64
}

const minSlots = 8

// candidates yields, in probe order, the positions indexed under hash:
// those whose slot holds hash, which the owner then compares with what it
// looks for.
func (x *index) candidates(hash uint32) iter.Seq[int32] {
	return func(yield func(int32) bool) {
		if len(x.slots) == 0 {
			return
		}
		for i := x.home(hash); x.slots[i] != 0; i = x.next(i) {
			if s := x.slots[i]; uint32(s>>32) == hash && !yield(int32(uint32(s))-1) {
				return
			}
		}
	}
}

// add indexes pos under hash; held is how many positions the index held
// before. It grows the index first if that would make it more than 80%
// full: the hashes in the slots keep long probe runs cheap.
func (x *index) add(hash uint32, pos int32, held int) {
	if (held+1)*5 > len(x.slots)*4 {
		x.grow()
	}
	x.place(uint64(hash)<<32 | uint64(pos+1))
}

// delete removes pos, indexed under hash, which must be there.
func (x *index) delete(hash uint32, pos int32) {
	want := uint64(hash)<<32 | uint64(pos+1)
	i := x.home(hash)
	for x.slots[i] != want {
		i = x.next(i)
	}
	// Backward-shift deletion: move later members of the probe run into
	// the hole when their home slot allows it, so find needs no tombstones.
	for j := x.next(i); ; j = x.next(j) {
		s := x.slots[j]
		if s == 0 {
			break
		}
		if x.dist(x.home(uint32(s>>32)), j) >= x.dist(i, j) {
			x.slots[i] = s
			i = j
		}
	}
	x.slots[i] = 0
}

// home returns the slot a hash starts probing at. Multiplying rather than
// masking maps hashes onto any index size, so that the index can grow by
// half rather than double, which keeps its load, and memory, higher.
func (x *index) home(hash uint32) int {
	return int(uint64(hash) * uint64(len(x.slots)) >> 32)
}

// next returns the slot after i, wrapping at the end.
func (x *index) next(i int) int {
	if i++; i == len(x.slots) {
		return 0
	}
	return i
}

// dist returns how many slots forward from a it is to b.
func (x *index) dist(a, b int) int {
	if b >= a {
		return b - a
	}
	return b + len(x.slots) - a
}

// place puts a slot value at the first free slot from its home.
func (x *index) place(slot uint64) {
	for i := x.home(uint32(slot >> 32)); ; i = x.next(i) {
		if x.slots[i] == 0 {
			x.slots[i] = slot
			return
		}
	}
}

func (x *index) grow() {
	old := x.slots
	x.slots = make([]uint64, max(minSlots, len(old)+len(old)/2))
	for _, s := range old {
		if s != 0 {
			x.place(s)
		}
	}
}
