package limiter

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/cespare/xxhash/v2"

	"github.com/ringlimit/ringlimit/algorithms"
)

// Counter is one counter's whole state, so that it can move to another
// node when the ring changes.
type Counter struct {
	Name, Key string
	Algorithm Algorithm
	// Words are the algorithm state's fields in declaration order (every
	// state type but SlidingLog is a struct of int64 fields).
	Words []int64
	// Log is a SlidingLog's entries as (Unix ns, hits) pairs, oldest first.
	Log []int64
	// Last is the latest time the counter was evaluated at, and Full when
	// it is back to full (Unix ns).
	Last, Full int64
}

// ErrBadCounter reports a Counter that does not decode into its
// algorithm's state.
var ErrBadCounter = errors.New("bad counter state")

// Extract removes and returns up to most counters whose key move accepts,
// for hand-off to their new owner. Call it until it returns none.
func (s *Store) Extract(move func(key string) bool, most int) []Counter {
	var out []Counter
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for a, t := range sh.tables {
			out = t.extract(Algorithm(a), move, out, most)
		}
		sh.mu.Unlock()
		if len(out) >= most {
			break
		}
	}
	s.held.Add(-int64(len(out)))
	return out
}

// Merge takes c into the store: a new counter is inserted, an existing one
// keeps the more charged of the two states, so that merging never refills
// a counter.
func (s *Store) Merge(c Counter) error {
	if !c.Algorithm.Valid() {
		return fmt.Errorf("%w: algorithm %d", ErrBadCounter, c.Algorithm)
	}
	r := Request{Name: c.Name, Key: c.Key}
	sh := s.shard(c.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.tables[c.Algorithm]
	id, hash := sh.counterID(&r)
	idx := t.find(id, hash)
	if idx < 0 {
		s.makeRoom(sh, t, c.Last)
		idx = t.insert(id, hash, c.Last)
		s.held.Add(1)
	}
	return t.merge(idx, c)
}

func (t *table[S, P]) extract(a Algorithm, move func(key string) bool, out []Counter, most int) []Counter {
	for idx := t.head; idx >= 0 && len(out) < most; {
		e := &t.entries[idx]
		next := e.next
		name, key, _ := strings.Cut(e.id, "\x00")
		if move(key) {
			words, log := encode(&e.state)
			out = append(out, Counter{Name: name, Key: key, Algorithm: a, Words: words, Log: log, Last: e.last, Full: e.full})
			t.remove(idx, fold(xxhash.Sum64String(e.id)))
		}
		idx = next
	}
	return out
}

func (t *table[S, P]) merge(idx int32, c Counter) error {
	s, err := decode[S](c.Words, c.Log)
	if err != nil {
		return err
	}
	e := &t.entries[idx]
	P(&e.state).Merge(s)
	e.last = max(e.last, c.Last)
	e.full = max(e.full, c.Full)
	return nil
}

// encode returns the fields of an algorithm state. Hand-off is rare, so
// reflection over the exported int64 fields serves every plain state type
// without a codec each.
func encode[S any](s *S) (words, log []int64) {
	if l, ok := any(s).(*algorithms.SlidingLog); ok {
		for ts, n := range l.Entries() {
			log = append(log, ts, n)
		}
		return nil, log
	}
	v := reflect.ValueOf(s).Elem()
	words = make([]int64, v.NumField())
	for i := range words {
		words[i] = v.Field(i).Int()
	}
	return words, nil
}

// decode is the inverse of encode. A log longer than a SlidingLog can
// need is refused, so that a peer cannot make this node allocate without
// bound.
func decode[S any](words, log []int64) (S, error) {
	var s S
	if l, ok := any(&s).(*algorithms.SlidingLog); ok {
		if len(log)%2 != 0 || len(log)/2 > algorithms.MaxSlidingLogLimit {
			return s, fmt.Errorf("%w: sliding log of %d values", ErrBadCounter, len(log))
		}
		for i := 0; i < len(log); i += 2 {
			l.Append(log[i], log[i+1])
		}
		return s, nil
	}
	v := reflect.ValueOf(&s).Elem()
	if len(words) != v.NumField() {
		return s, fmt.Errorf("%w: %d words for %T, want %d", ErrBadCounter, len(words), s, v.NumField())
	}
	for i, w := range words {
		v.Field(i).SetInt(w)
	}
	return s, nil
}
