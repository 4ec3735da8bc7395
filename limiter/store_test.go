package limiter

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringlimit/ringlimit/algorithms"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func req(key string, hits int64, at time.Duration) Request {
	return Request{Name: "api", Key: key, Algorithm: TokenBucket, Hits: hits, Now: t0.Add(at),
		Limit: algorithms.Limit{Count: 2, Period: time.Second}}
}

func TestDecideTimeline(t *testing.T) {
	s := New(Config{})
	steps := []struct {
		name    string
		r       Request
		allowed bool
		remain  int64
	}{
		{"first", req("u1", 1, 0), true, 1},
		{"second", req("u1", 1, 0), true, 0},
		{"refused", req("u1", 1, 0), false, 0},
		{"refused is not charged: half a second refills one", req("u1", 1, 500*time.Millisecond), true, 0},
		{"peek charges nothing", req("u1", 0, 500*time.Millisecond), true, 0},
		{"other key is independent", req("u2", 2, 500*time.Millisecond), true, 0},
		{"earlier time is clamped: no refill from the past", req("u1", 1, 100*time.Millisecond), false, 0},
		{"reset forgets", Request{Name: "api", Key: "u1", Algorithm: TokenBucket, Hits: 1, Reset: true, Now: t0.Add(500 * time.Millisecond), Limit: algorithms.Limit{Count: 2, Period: time.Second}}, true, 1},
	}
	for _, st := range steps {
		d := s.Decide(&st.r)
		if d.Allowed != st.allowed || d.Remaining != st.remain {
			t.Errorf("%s: got allowed=%v remaining=%d, want %v %d", st.name, d.Allowed, d.Remaining, st.allowed, st.remain)
		}
	}
}

func TestNameAndAlgorithmSeparateCounters(t *testing.T) {
	s := New(Config{})
	a := req("u1", 2, 0)
	b := a
	b.Name = "other"
	c := a
	c.Algorithm = GCRA
	for _, r := range []Request{a, b, c} {
		if d := s.Decide(&r); !d.Allowed {
			t.Errorf("%s/%s: refused, want a fresh counter", r.Name, r.Algorithm)
		}
	}
	// ("ab","c") and ("a","bc") must not share a counter.
	x := Request{Name: "ab", Key: "c", Hits: 2, Now: t0, Limit: algorithms.Limit{Count: 2, Period: time.Second}}
	y := Request{Name: "a", Key: "bc", Hits: 2, Now: t0, Limit: algorithms.Limit{Count: 2, Period: time.Second}}
	s.Decide(&x)
	if d := s.Decide(&y); !d.Allowed {
		t.Error("(a, bc) shares a counter with (ab, c)")
	}
}

func TestDecideAllIsAllOrNothing(t *testing.T) {
	s := New(Config{})
	perMinute := Request{Name: "per-minute", Key: "user:42", Hits: 1, Now: t0, Limit: algorithms.Limit{Count: 100, Period: time.Minute}}
	perSecond := Request{Name: "per-second", Key: "user:42", Hits: 1, Now: t0, Limit: algorithms.Limit{Count: 2, Period: time.Second}}
	group := []Request{perMinute, perSecond}
	out := make([]algorithms.Decision, 2)
	for i := range 2 {
		s.DecideAll(group, out)
		if !out[0].Allowed || !out[1].Allowed {
			t.Fatalf("request %d: refused %+v", i, out)
		}
	}
	s.DecideAll(group, out)
	if out[0].Allowed || out[1].Allowed {
		t.Fatalf("third request in one second: got %+v, want both refused", out)
	}
	if out[0].RetryAfter != out[1].RetryAfter || out[0].RetryAfter <= 0 {
		t.Errorf("refused group: RetryAfter %v and %v, want the group's, positive", out[0].RetryAfter, out[1].RetryAfter)
	}
	// The refused group charged nothing: the per-minute counter spent 2.
	peek := perMinute
	peek.Hits = 0
	if d := s.Decide(&peek); d.Remaining != 98 {
		t.Errorf("per-minute remaining %d after a refused group, want 98", d.Remaining)
	}
}

// TestDecideAllSharedCounter: two requests of a group on one counter are
// admitted only if the counter has room for both: each alone fits, both
// do not, so the group is refused and nothing is charged (the first used
// to be charged and the second refused).
func TestDecideAllSharedCounter(t *testing.T) {
	for a := range NumAlgorithms {
		if a == Spacing {
			continue // a spacing counts requests, not hits (TestSpacedDecideAll)
		}
		t.Run(a.String(), func(t *testing.T) {
			s := New(Config{})
			six := Request{Name: "api", Key: "user:42", Algorithm: a, Hits: 6, Now: t0, Limit: algorithms.Limit{Count: 10, Period: time.Hour}}
			out := make([]algorithms.Decision, 2)
			s.DecideAll([]Request{six, six}, out)
			if out[0].Allowed || out[1].Allowed {
				t.Errorf("6 + 6 hits of 10 in one group: %+v, want both refused", out)
			}
			peek := six
			peek.Hits = 0
			if d := s.Check(&peek); d.Remaining != 10 {
				t.Errorf("%d remaining after a refused group, want 10: nothing charged", d.Remaining)
			}
			five := six
			five.Hits = 5
			s.DecideAll([]Request{five, five}, out)
			if !out[0].Allowed || !out[1].Allowed || out[1].Remaining != 0 {
				t.Errorf("5 + 5 hits of 10 in one group: %+v, want both admitted, 0 left", out)
			}
		})
	}
}

// TestEvictionAtMaxKeys: at MaxKeys the store evicts counters back to
// full, and while every counter holds spent hits it evicts the least
// recently used anyway and keeps its debt (counted), so that new keys are
// admitted and no old debt is forgiven: the evicted counters are restored
// from their debts when checked again. (Before, the new keys were refused
// with ErrFull until the debts refilled: issue 33's lock-out.)
func TestEvictionAtMaxKeys(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := New(Config{MaxKeys: 100, Registerer: reg})
	hourly := func(key string, hits int64, at time.Duration) Request {
		r := req(key, hits, at)
		r.Limit.Period = time.Hour // never idle within the hour
		return r
	}
	for i := range 300 {
		r := hourly(fmt.Sprint("k", i), 1, time.Duration(i)*time.Millisecond)
		if d, err := s.Try(&r); err != nil || !d.Allowed {
			t.Fatalf("k%d: %+v, %v; want admitted", i, d, err)
		}
	}
	if n := s.Len(); n != 100 {
		t.Errorf("Len = %d, want 100", n)
	}
	if ev, owing, ref := testutil.ToFloat64(s.metrics.evictions), testutil.ToFloat64(s.metrics.evictedOwing), testutil.ToFloat64(s.metrics.refused); ev != 0 || owing != 200 || ref != 0 {
		t.Errorf("evictions = %v, evicted owing = %v, refused = %v; want 0, 200 and 0", ev, owing, ref)
	}
	// The first counter, the least recently used, kept its debt: a token
	// bucket is restored exactly, one of its two hits left, then none.
	for i, allowed := range []bool{true, false} {
		r := hourly("k0", 1, time.Second)
		if d := s.Decide(&r); d.Allowed != allowed {
			t.Errorf("k0, check %d: %+v; want allowed %v: its debt was forgiven or lost", i, d, allowed)
		}
	}
	// Two hours on, every counter is full again, and every debt paid: new
	// keys evict them.
	// (The new keys are GCRA's: a table drops its own idle counters
	// before anything is evicted.)
	for i := range 100 {
		r := hourly(fmt.Sprint("new", i), 1, 2*time.Hour)
		r.Algorithm = GCRA
		if _, err := s.Try(&r); err != nil {
			t.Fatalf("new%d, every counter full again: %v", i, err)
		}
	}
	if n := s.Len(); n != 100 {
		t.Errorf("Len = %d, want 100", n)
	}
	if ev := testutil.ToFloat64(s.metrics.evictions); ev != 100 {
		t.Errorf("evictions = %v, want 100: the full counters make room", ev)
	}
}
func TestIdleCountersAreDropped(t *testing.T) {
	s := New(Config{MaxKeys: 1000})
	for i := range 500 {
		r := req(fmt.Sprint("k", i), 1, 0)
		s.Decide(&r)
	}
	// A second later every counter is full again; new inserts drop them.
	for i := range 500 {
		r := req(fmt.Sprint("new", i), 1, time.Second)
		s.Decide(&r)
	}
	if n := s.Len(); n >= 1000 {
		t.Errorf("Len = %d: idle counters were not dropped", n)
	}
	if got := testutil.ToFloat64(s.metrics.evictions); got != 0 {
		t.Errorf("evictions = %v, want 0: idle counters are dropped, not evicted", got)
	}
}

// TestTableMatchesMap drives one table with random inserts, lookups and
// removals, and compares it with a Go map.
func TestTableMatchesMap(t *testing.T) {
	tb := newTable[algorithms.TokenBucket](new(atomic.Int64))
	want := map[string]int32{}
	rng := rand.New(rand.NewPCG(1, 2))
	for step := range 50_000 {
		id := []byte(fmt.Sprint("key-", rng.IntN(3000)))
		h := fold(xxhash.Sum64(id))
		idx := tb.find(id, h)
		wantIdx, ok := want[string(id)]
		if ok != (idx >= 0) || (ok && idx != wantIdx) {
			t.Fatalf("step %d: find(%s) = %d, want %d (present %v)", step, id, idx, wantIdx, ok)
		}
		switch {
		case !ok:
			want[string(id)] = tb.insert(id, h, 0)
		case rng.IntN(2) == 0:
			tb.remove(idx, h)
			delete(want, string(id))
		}
		if tb.n != len(want) {
			t.Fatalf("step %d: n = %d, want %d", step, tb.n, len(want))
		}
	}
}

// TestConcurrentDecide decides checks of every kind, spaced or not, on
// 300 keys from 8 goroutines, and among them 1,600 checks of one counter
// of 10: exactly 10 are admitted.
func TestConcurrentDecide(t *testing.T) {
	s := New(Config{MaxKeys: 5000})
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for g := range 8 {
		wg.Go(func() {
			n := 0
			for i := range 2000 {
				r := Request{Name: "n", Key: fmt.Sprint("k", (g*7+i)%300), Algorithm: Algorithm(i % int(NumAlgorithms)), Hits: 1, Now: t0,
					Limit: algorithms.Limit{Count: 10, Period: time.Hour}, MinInterval: time.Duration(i%2) * time.Second}
				s.Decide(&r)
				if i%10 == 0 {
					k0 := Request{Name: "k0", Key: "k0", Hits: 1, Now: t0, Limit: algorithms.Limit{Count: 10, Period: time.Hour}}
					if s.Decide(&k0).Allowed {
						n++
					}
				}
			}
			mu.Lock()
			admitted += n
			mu.Unlock()
		})
	}
	wg.Wait()
	if admitted != 10 {
		t.Errorf("k0 admitted %d under concurrency, want exactly 10", admitted)
	}
}

func TestDecideDoesNotAllocate(t *testing.T) {
	s := New(Config{})
	for a := range NumAlgorithms {
		r := Request{Name: "api", Key: "user:42", Algorithm: a, Hits: 1, Now: t0, Limit: algorithms.Limit{Count: 1000, Period: time.Second}}
		s.Decide(&r) // create the counter
		if n := testing.AllocsPerRun(100, func() { s.Decide(&r) }); n != 0 {
			t.Errorf("%s: Decide allocates %v times per call, want 0", a, n)
		}
	}
}

// TestChargeRefused: with ChargeRefused a fixed window counts refused hits
// (so the next peek is refused too); other algorithms ignore the flag.
func TestChargeRefused(t *testing.T) {
	s := New(Config{})
	fw := func(hits int64, charge bool) Request {
		r := req("u", hits, 0)
		r.Algorithm, r.ChargeRefused = FixedWindow, charge
		return r
	}
	for i, step := range []struct {
		r       Request
		allowed bool
		remain  int64
	}{
		{fw(2, true), true, 0},
		{fw(1, false), false, 0},
		{fw(0, true), true, 0}, // count 2 of 2: not over
		{fw(1, true), false, 0},
		{fw(0, true), false, 0}, // count 3 > 2: refused without charging
	} {
		if d := s.Decide(&step.r); d.Allowed != step.allowed || d.Remaining != step.remain {
			t.Errorf("step %d: %+v, want allowed %v remaining %d", i, d, step.allowed, step.remain)
		}
	}
	tb := req("v", 2, 0)
	tb.ChargeRefused = true
	s.Decide(&tb)
	tb.Hits = 1
	s.Decide(&tb)
	tb.Now = t0.Add(500 * time.Millisecond)
	if d := s.Decide(&tb); !d.Allowed {
		t.Errorf("a token bucket charged a refusal: %+v", d)
	}
}
