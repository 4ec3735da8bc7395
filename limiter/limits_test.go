package limiter

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// tokenBuckets returns the token-bucket table of s's shard i.
func tokenBuckets(s *Store, i int) *table[algorithms.TokenBucket, *algorithms.TokenBucket] {
	return s.shards[i].tables[TokenBucket].(*table[algorithms.TokenBucket, *algorithms.TokenBucket])
}

// interned returns how many limits the token-bucket tables of s intern,
// and the most indexes any of them has room for.
func interned(s *Store) (held, room int) {
	for i := range s.shards {
		ls := &tokenBuckets(s, i).limits
		held += ls.held()
		room = max(room, len(ls.vals))
	}
	return held, room
}

// perSecond is n hits a second, one limit for each n.
func perSecond(n int) algorithms.Limit {
	return algorithms.Limit{Count: int64(n), Period: time.Second}
}

// TestLimitsMatchMap drives one table's limits with random holds and
// releases, and compares them with a map of reference counts: each limit
// held keeps its index, an index gives back its limit, and a limit no
// counter holds is forgotten.
func TestLimitsMatchMap(t *testing.T) {
	ls := newLimits()
	uses := map[algorithms.Limit]int32{}
	index := map[algorithms.Limit]uint32{}
	var holders []uint32 // one index per reference held, as entries hold them
	rng := rand.New(rand.NewPCG(3, 4))
	for step := range 50_000 {
		if len(holders) > 0 && rng.IntN(2) == 0 {
			k := rng.IntN(len(holders))
			i := holders[k]
			holders[k] = holders[len(holders)-1]
			holders = holders[:len(holders)-1]
			l := ls.at(i)
			ls.release(i)
			if uses[l]--; uses[l] == 0 {
				delete(uses, l)
				delete(index, l)
			}
		} else {
			l := perSecond(1 + rng.IntN(300))
			i := ls.hold(l)
			if want, ok := index[l]; ok && i != want {
				t.Fatalf("step %d: hold(%v) = %d, but it is held at %d", step, l, i, want)
			}
			index[l] = i
			uses[l]++
			holders = append(holders, i)
		}
		if ls.held() != len(uses) {
			t.Fatalf("step %d: %d limits interned, want %d", step, ls.held(), len(uses))
		}
		for l, i := range index {
			if ls.at(i) != l || ls.uses[i] != uses[l] {
				t.Fatalf("step %d: index %d holds %v used %d times, want %v used %d", step, i, ls.at(i), ls.uses[i], l, uses[l])
			}
		}
	}
	if room := len(ls.vals); room > 301 {
		t.Errorf("300 distinct limits took %d indexes, want at most 301", room)
	}
}

// TestZeroLimitIsIndexZero: a new entry's zero limit index is the zero
// Limit, held by no count, so that making and dropping entries that were
// never evaluated needs no bookkeeping.
func TestZeroLimitIsIndexZero(t *testing.T) {
	ls := newLimits()
	if i := ls.hold(algorithms.Limit{}); i != 0 {
		t.Errorf("hold of the zero Limit = %d, want 0", i)
	}
	ls.release(0)
	if ls.at(0) != (algorithms.Limit{}) || ls.held() != 0 {
		t.Errorf("after hold and release of the zero Limit: at(0) = %v, %d held", ls.at(0), ls.held())
	}
}

// TestLimitChangeOfOneCounterAmongMany: a thousand counters share one
// interned limit; one of them changes limit and follows it (clamped, as
// TestPoisonedLimit asks) while the others keep theirs and their state,
// and the old limit is interned once as long as any of them holds it.
func TestLimitChangeOfOneCounterAmongMany(t *testing.T) {
	s := New(Config{MaxKeys: 1000}) // one shard
	shared := perMinute10
	for i := range 1000 {
		s.Decide(&Request{Name: "api", Key: fmt.Sprint("k", i), Hits: 4, Now: t0, Limit: shared})
	}
	if held, _ := interned(s); held != 1 {
		t.Fatalf("1,000 counters of one limit intern %d limits, want 1", held)
	}
	if d := s.Decide(&Request{Name: "api", Key: "k7", Hits: 1, Now: t0, Limit: hostile}); d.Allowed {
		t.Fatalf("1 hit of 1 a year after 4 hits: %+v, want refused (clamped to the new limit)", d)
	}
	if held, _ := interned(s); held != 2 {
		t.Errorf("after one counter changed limit, %d limits interned, want 2", held)
	}
	for c := range s.Counters() {
		want := shared
		if c.Key == "k7" {
			want = hostile
		}
		if c.Limit != want {
			t.Fatalf("%s: limit %+v, want %+v", c.Key, c.Limit, want)
		}
	}
	if d := s.Decide(&Request{Name: "api", Key: "k8", Hits: 6, Now: t0, Limit: shared}); !d.Allowed || d.Remaining != 0 {
		t.Errorf("k8, 6 more of 10 after 4: %+v, want admitted with 0 left", d)
	}
	s.Decide(&Request{Name: "api", Key: "k7", Now: t0, Limit: shared})
	if held, _ := interned(s); held != 1 {
		t.Errorf("after k7 went back to the shared limit, %d limits interned, want 1", held)
	}
}

// TestOneKeyManyLimits is the bound for one key: a client that sends a
// distinct limit with each of a million checks leaves one interned, and the table's
// room for limits does not grow.
func TestOneKeyManyLimits(t *testing.T) {
	s := New(Config{MaxKeys: 1000})
	for i := range 1_000_000 {
		r := Request{Name: "api", Key: "k", Hits: 1, Now: t0.Add(time.Duration(i)), Limit: perSecond(1 + i)}
		s.Decide(&r)
		if held, room := interned(s); held != 1 || room > 3 {
			t.Fatalf("after %d limits on one key: %d interned in room for %d, want 1 in at most 3", i+1, held, room)
		}
	}
}

// TestManyKeysManyLimitsBoundedByMaxKeys is the bound for many keys: a
// client that sends a distinct limit for each of 100,000 keys to a store
// of 2,048 counters makes the store evict counters, and each evicted
// counter's limit is forgotten with it, so a table interns no more
// limits than it holds counters, and its room for them stays near that.
func TestManyKeysManyLimitsBoundedByMaxKeys(t *testing.T) {
	const maxKeys = 2048
	s := New(Config{MaxKeys: maxKeys})
	for i := range 100_000 {
		r := Request{Name: "api", Key: fmt.Sprint("k", i), Hits: 1, Now: t0, Limit: algorithms.Limit{Count: int64(1 + i), Period: time.Hour}}
		s.Decide(&r)
	}
	held, room := interned(s)
	if most := maxKeys + len(s.shards); held != s.Len() || held > most {
		t.Errorf("%d limits interned for %d counters, want one each, at most %d", held, s.Len(), most)
	}
	if room > maxKeys+2 {
		t.Errorf("room for %d limits, want at most %d", room, maxKeys+2)
	}
}

// TestLimitsForgottenWhenCountersLeave: every way a counter leaves its
// table (idle drop, eviction, extraction for hand-off, TakeOut) gives back
// its limit, and one that no counter holds is forgotten.
func TestLimitsForgottenWhenCountersLeave(t *testing.T) {
	own := func(i int) algorithms.Limit {
		return algorithms.Limit{Count: 10, Period: time.Duration(1+i) * time.Second}
	}
	fillOwn := func(s *Store, n int) {
		for i := range n {
			s.Decide(&Request{Name: "api", Key: fmt.Sprint("k", i), Hits: 1, Now: t0, Limit: own(i)})
		}
	}
	for _, c := range []struct {
		name  string
		leave func(s *Store)
		want  int // limits still interned of the 100
	}{
		{"idle drop", func(s *Store) {
			// An hour later all 100 are full again; each insert drops up to two.
			for i := range 50 {
				s.Decide(&Request{Name: "api", Key: fmt.Sprint("new", i), Now: t0.Add(time.Hour), Limit: perMinute10})
			}
		}, 1}, // the new counters' one limit
		{"eviction at MaxKeys", func(s *Store) {
			// Two minutes later all 100 are full again, so room is made
			// of them; a counter still charged is never evicted.
			for i := range 1000 {
				s.Decide(&Request{Name: "api", Key: fmt.Sprint("new", i), Hits: 1, Now: t0.Add(2 * time.Minute), Limit: perMinute10})
			}
		}, 1},
		{"extract", func(s *Store) {
			for range s.Extract(func(key string) bool { return key != "k3" }) {
			}
		}, 1}, // k3's
		{"take out", func(s *Store) {
			for i := range 100 {
				s.TakeOut(&Request{Name: "api", Key: fmt.Sprint("k", i), Algorithm: TokenBucket})
			}
		}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := New(Config{MaxKeys: 1000}) // one shard
			fillOwn(s, 100)
			if held, _ := interned(s); held != 100 {
				t.Fatalf("100 counters of their own limits: %d interned", held)
			}
			c.leave(s)
			if held, _ := interned(s); held != c.want {
				t.Errorf("%d limits interned after the counters left, want %d", held, c.want)
			}
		})
	}
}

// TestManyLimitsExportExact: 3,000 counters of every algorithm, each
// under a limit of its own, decide as fresh counters do and leave the
// store (Counters, Charged, Changed, Extract and Merge: snapshots,
// replication and hand-off) with exactly their own limit, state and time.
func TestManyLimitsExportExact(t *testing.T) {
	const n = 3000
	from := New(Config{MaxKeys: int(NumAlgorithms) * n})
	limit := func(i int) algorithms.Limit {
		return algorithms.Limit{Count: int64(10 + i%7), Period: time.Duration(1+i) * time.Minute, Burst: int64(i % 3)}
	}
	for a := range NumAlgorithms {
		for i := range n {
			l := limit(i)
			if a == Spacing {
				l = SpacingLimit(l.Period)
			}
			r := Request{Name: "api", Key: fmt.Sprint("k", i), Algorithm: a, Hits: 1, Now: t0, Limit: l}
			if d := from.Decide(&r); !d.Allowed {
				t.Fatalf("%s k%d: the first hit under its own limit refused: %+v", a, i, d)
			}
		}
	}
	byKey := func(cs []Counter) []Counter {
		slices.SortFunc(cs, func(x, y Counter) int {
			return cmp.Or(cmp.Compare(x.Algorithm, y.Algorithm), cmp.Compare(x.Key, y.Key))
		})
		return cs
	}
	collect := func(seq func(func(Counter) bool)) []Counter {
		var cs []Counter
		for c := range seq {
			c.State = slices.Clone(c.State)
			cs = append(cs, c)
		}
		return byKey(cs)
	}
	want := collect(from.Counters())
	if len(want) != n*int(NumAlgorithms) {
		t.Fatalf("Counters yields %d, want %d", len(want), n*int(NumAlgorithms))
	}
	for _, c := range want {
		var i int
		fmt.Sscanf(c.Key, "k%d", &i)
		l := limit(i)
		if c.Algorithm == Spacing {
			l = SpacingLimit(l.Period)
		}
		if c.Limit != l || c.Last != t0.UnixNano() {
			t.Fatalf("%s %s: limit %+v at %d, want %+v at %d", c.Algorithm, c.Key, c.Limit, c.Last, l, t0.UnixNano())
		}
	}
	for name, got := range map[string][]Counter{
		"Charged": collect(from.Charged(t0)),
		"Changed": collect(from.Changed()),
	} {
		if !slices.EqualFunc(got, want, counterEqual) {
			t.Errorf("%s yields other counters than Counters", name)
		}
	}
	to := New(Config{MaxKeys: int(NumAlgorithms) * n})
	handOff(t, from, to, t0)
	if held, _ := interned(from); held != 0 {
		t.Errorf("the emptied store interns %d limits, want 0", held)
	}
	if held, _ := interned(to); held != n {
		t.Errorf("the receiving store interns %d token-bucket limits, want %d", held, n)
	}
	if got := collect(to.Counters()); !slices.EqualFunc(got, want, counterEqual) {
		t.Error("the receiving store holds other counters than were handed off")
	}
}

func counterEqual(x, y Counter) bool {
	return x.Name == y.Name && x.Key == y.Key && x.Algorithm == y.Algorithm && x.Role == y.Role &&
		x.Limit == y.Limit && x.Last == y.Last && slices.Equal(x.State, y.State)
}

// TestChangingAmongManyLimitsDoesNotAllocate: once a table has had room
// for a set of limits, counters moving among them allocate nothing.
func TestChangingAmongManyLimitsDoesNotAllocate(t *testing.T) {
	s := New(Config{})
	rs := make([]Request, 50)
	for i := range rs {
		rs[i] = Request{Name: "api", Key: fmt.Sprint("k", i), Hits: 1, Now: t0, Limit: perSecond(1000 + i)}
		s.Decide(&rs[i])
	}
	round := 0
	if n := testing.AllocsPerRun(20, func() {
		round++
		for i := range rs {
			rs[i].Limit = perSecond(1000 + (i+round)%len(rs))
			s.Decide(&rs[i])
		}
	}); n != 0 {
		t.Errorf("deciding 50 counters under each other's limits allocates %v times per round, want 0", n)
	}
}
