// Package top answers an operator's first question of a limiter: who is
// being limited right now, and which keys are hot. A node keeps, for each
// limit name, the keys it decided most checks for and the keys it refused
// most, in fixed memory whatever the keys, and reports their counts over a
// recent interval; Merge sums the reports of several nodes.
//
// The counts are space-saving sketches (Metwally, Agrawal and El Abbadi,
// 2005): a sketch of capacity k counts exactly while it has seen at most k
// distinct keys; beyond that a new key takes the place of the smallest
// count and inherits it as its error, so every key counted more than
// total/k times is in the sketch, over by at most its error. Limit names
// are themselves kept in a sketch, so a flood of names costs no more
// memory than a flood of keys.
package top

import (
	"cmp"
	"slices"
	"strings"
)

// MaxKeyBytes is how much of a key, or a limit name, a sketch keeps. A
// longer one is counted under its full hash and shown by this prefix,
// marked as truncated: memory stays fixed however long the keys are.
const MaxKeyBytes = 128

// entry is one counted key of a Sketch.
type entry struct {
	hash  uint64 // of the whole key: what entries are told apart by
	count uint64 // an overestimate of the key's count, by at most err
	err   uint64 // the count the key inherited when it took its slot
	at    int32  // its position in Sketch.heap
	n     uint8  // bytes of key in use
	long  bool   // the key was longer than MaxKeyBytes
	key   [MaxKeyBytes]byte
}

// Sketch is a space-saving sketch of the keys counted most: fixed memory
// (its capacity in entries, each holding MaxKeyBytes of key), no
// allocation once each slot has been taken, O(log capacity) per Add.
// Keys are told apart by a 64-bit hash that the caller computes with a
// random seed (Tracker does), so that clients cannot choose colliding
// keys. The zero value has capacity 0 and counts nothing; use NewSketch.
// A Sketch is not safe for concurrent use.
type Sketch struct {
	ents  []entry          // capacity fixed by NewSketch
	heap  []int32          // indexes of ents, a min-heap by count
	index map[uint64]int32 // hash -> index of ents
	total uint64
}

// NewSketch returns an empty sketch of capacity k.
func NewSketch(k int) *Sketch {
	s := &Sketch{}
	s.init(k)
	return s
}

func (s *Sketch) init(k int) {
	s.ents = make([]entry, 0, k)
	s.heap = make([]int32, 0, k)
	s.index = make(map[uint64]int32, k)
}

// Reset forgets every key, keeping the memory.
func (s *Sketch) Reset() {
	s.ents = s.ents[:0]
	s.heap = s.heap[:0]
	clear(s.index)
	s.total = 0
}

// Add counts n for key, whose hash is h. It returns the slot the key is
// counted in (below the capacity), and whether the key has just taken it,
// evicting the key with the smallest count when the sketch was full. With
// capacity 0 it counts only the total and returns -1.
func (s *Sketch) Add(h uint64, key string, n uint64) (slot int, fresh bool) {
	s.total += n
	if i, ok := s.index[h]; ok {
		e := &s.ents[i]
		e.count += n
		s.down(int(e.at))
		return int(i), false
	}
	var i int32
	switch {
	case len(s.ents) < cap(s.ents):
		i = int32(len(s.ents))
		s.ents = s.ents[:i+1]
		s.ents[i] = entry{at: int32(len(s.heap)), count: n}
		s.heap = append(s.heap, i)
		s.up(len(s.heap) - 1)
	case len(s.ents) == 0:
		return -1, false
	default:
		i = s.heap[0]
		e := &s.ents[i]
		delete(s.index, e.hash)
		e.err = e.count
		e.count += n
		s.down(0)
	}
	e := &s.ents[i]
	e.hash = h
	e.n = uint8(copy(e.key[:], key))
	e.long = len(key) > MaxKeyBytes
	s.index[h] = i
	return int(i), true
}

// less orders the heap: smallest count first.
func (s *Sketch) less(a, b int) bool {
	return s.ents[s.heap[a]].count < s.ents[s.heap[b]].count
}

func (s *Sketch) swap(a, b int) {
	s.heap[a], s.heap[b] = s.heap[b], s.heap[a]
	s.ents[s.heap[a]].at = int32(a)
	s.ents[s.heap[b]].at = int32(b)
}

func (s *Sketch) up(j int) {
	for j > 0 {
		p := (j - 1) / 2
		if !s.less(j, p) {
			return
		}
		s.swap(j, p)
		j = p
	}
}

func (s *Sketch) down(j int) {
	for {
		l := 2*j + 1
		if l >= len(s.heap) {
			return
		}
		c := l
		if r := l + 1; r < len(s.heap) && s.less(r, l) {
			c = r
		}
		if !s.less(c, j) {
			return
		}
		s.swap(j, c)
		j = c
	}
}

// Total returns the sum of every n added since the last Reset: exact,
// whatever the capacity.
func (s *Sketch) Total() uint64 { return s.total }

// Count is one key of a sketch as read: Count overestimates the key's
// true count by at most Error (zero while the sketch has room for every
// key it has seen).
type Count struct {
	Key       string
	Truncated bool // Key is the first MaxKeyBytes of a longer key
	Count     uint64
	Error     uint64
}

// Counts returns the keys in the sketch, by count, largest first. It
// allocates; it is for reports, not the hot path.
func (s *Sketch) Counts() []Count {
	out := make([]Count, len(s.ents))
	for i := range s.ents {
		e := &s.ents[i]
		out[i] = Count{Key: string(e.key[:e.n]), Truncated: e.long, Count: e.count, Error: e.err}
	}
	sortCounts(out)
	return out
}

// slotKey returns the key counted in slot i, as Counts would.
func (s *Sketch) slotKey(i int) (string, bool) {
	e := &s.ents[i]
	return string(e.key[:e.n]), e.long
}

func sortCounts(cs []Count) {
	slices.SortFunc(cs, func(a, b Count) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
}
