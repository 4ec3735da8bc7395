package limiter

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

const skew = 10 * time.Minute

// fill makes 20 counters of every algorithm, k0..k19, each charged 4 of
// 10 a minute at t0 (a spacing, one request a minute).
func fill(s *Store) {
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	for a := range NumAlgorithms {
		for i := range 20 {
			r := Request{Name: "api", Key: fmt.Sprint("k", i), Algorithm: a, Hits: 4, Now: t0, Limit: l}
			s.Decide(&r)
		}
	}
}

// TestExtractMergeKeepsState moves every counter of every algorithm from
// one store to another, through the binary record, and checks the new
// store goes on where the old one stopped.
func TestExtractMergeKeepsState(t *testing.T) {
	from, to := New(Config{}), New(Config{})
	fill(from)
	moved := 0
	for c := range from.Extract(func(key string) bool { return strings.HasPrefix(key, "k1") }) {
		if err := to.Merge(throughRecord(t, c), t0, skew); err != nil {
			t.Fatalf("Merge(%s %s): %v", c.Algorithm, c.Key, err)
		}
		moved++
	}
	if want := 11 * int(NumAlgorithms); moved != want { // k1, k10..k19
		t.Fatalf("moved %d counters, want %d", moved, want)
	}
	if from.Len() != 20*int(NumAlgorithms)-moved || to.Len() != moved {
		t.Errorf("Len: from %d, to %d", from.Len(), to.Len())
	}
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	for a := range NumAlgorithms {
		r := Request{Name: "api", Key: "k12", Algorithm: a, Hits: 0, Now: t0.Add(time.Millisecond), Limit: l}
		if d, want := to.Decide(&r), remainingAfter(a, 4, l); d.Remaining != want {
			t.Errorf("%s: moved counter has %d remaining, want %d", a, d.Remaining, want)
		}
	}
}

// TestExtractVisitsEachCounterOnce checks that extraction costs one visit
// per counter however it is consumed: the hand-off loop sends a batch at a
// time, and a scan restarting per batch would visit counters times batches.
func TestExtractVisitsEachCounterOnce(t *testing.T) {
	s := New(Config{MaxKeys: 100_000}) // many shards
	l := algorithms.Limit{Count: 10, Period: time.Hour}
	const n = 5000
	for i := range n {
		r := Request{Name: "api", Key: fmt.Sprint("k", i), Hits: 1, Now: t0, Limit: l}
		s.Decide(&r)
	}
	visits, moved, batch := 0, 0, 0
	for range s.Extract(func(key string) bool { visits++; return strings.HasSuffix(key, "7") }) {
		moved++
		if batch++; batch == 50 {
			batch = 0 // where the hand-off loop sends a batch
		}
	}
	if moved != n/10 {
		t.Errorf("moved %d counters, want %d", moved, n/10)
	}
	if visits != n {
		t.Errorf("visited %d counters to move %d of %d, want %d: one visit each", visits, moved, n, n)
	}
	if s.Len() != n-moved {
		t.Errorf("Len = %d, want %d", s.Len(), n-moved)
	}
}

// TestExtractStoppedEarlyPutsBack stops consuming after a few counters:
// what was yielded is the consumer's, the rest stays in the store.
func TestExtractStoppedEarlyPutsBack(t *testing.T) {
	s := New(Config{})
	fill(s)
	total := s.Len()
	var taken []Counter
	for c := range s.Extract(func(string) bool { return true }) {
		taken = append(taken, c)
		if len(taken) == 5 {
			break
		}
	}
	if s.Len() != total-5 {
		t.Fatalf("after taking 5 of %d, Len = %d", total, s.Len())
	}
	s.Restore(taken)
	if s.Len() != total {
		t.Fatalf("after Restore, Len = %d, want %d", s.Len(), total)
	}
	seen := 0
	for range s.Counters() {
		seen++
	}
	if seen != total {
		t.Errorf("Counters yields %d, want %d", seen, total)
	}
}

// TestCountersDoesNotTake reads every counter twice: nothing is removed
// and the copies decode to the states the store decides with.
func TestCountersDoesNotTake(t *testing.T) {
	s, copied := New(Config{}), New(Config{})
	fill(s)
	for range 2 {
		n := 0
		for c := range s.Counters() {
			if err := copied.Merge(c, t0, skew); err != nil {
				t.Fatal(err)
			}
			n++
		}
		if n != s.Len() || s.Len() != 20*int(NumAlgorithms) {
			t.Fatalf("Counters yielded %d, Len %d, want %d", n, s.Len(), 20*int(NumAlgorithms))
		}
	}
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	for a := range NumAlgorithms {
		r := Request{Name: "api", Key: "k3", Algorithm: a, Hits: 0, Now: t0.Add(time.Second), Limit: l}
		if got, want := copied.Decide(&r), s.Decide(&r); got != want {
			t.Errorf("%s: copy decides %+v, original %+v", a, got, want)
		}
	}
}

// TestChargedLeavesFullCounters: Charged yields the counters Counters
// does, less those back to full at now, which the store would drop as
// idle.
func TestChargedLeavesFullCounters(t *testing.T) {
	s := New(Config{})
	fill(s) // 4 of 10 a minute: every algorithm is full again within two minutes
	long := Request{Name: "api", Key: "long", Hits: 10, Now: t0, Limit: algorithms.Limit{Count: 10, Period: time.Hour}}
	s.Decide(&long)
	keys := func(now time.Time) (n int, last string) {
		for c := range s.Charged(now) {
			n, last = n+1, c.Key
		}
		return n, last
	}
	if n, _ := keys(t0); n != s.Len() || n != 20*int(NumAlgorithms)+1 {
		t.Errorf("Charged(t0) yields %d counters, want all %d", n, s.Len())
	}
	// Each yielded as Counters yields it, though Charged reuses one buffer
	// for the states (a State is valid until the next counter).
	want := map[string]string{}
	for c := range s.Counters() {
		want[fmt.Sprint(c.Algorithm, c.Key)] = fmt.Sprintf("%+v", c)
	}
	for c := range s.Charged(t0) {
		if got := fmt.Sprintf("%+v", c); got != want[fmt.Sprint(c.Algorithm, c.Key)] {
			t.Errorf("Charged yields %s, Counters %s", got, want[fmt.Sprint(c.Algorithm, c.Key)])
		}
	}
	if n, last := keys(t0.Add(10 * time.Minute)); n != 1 || last != "long" {
		t.Errorf("Charged ten minutes on yields %d counters (last %q), want only the one not full again: long", n, last)
	}
	if n, _ := keys(t0.Add(time.Hour)); n != 0 {
		t.Errorf("Charged an hour on yields %d counters, want none", n)
	}
	if s.Len() != 20*int(NumAlgorithms)+1 {
		t.Errorf("Charged took counters: Len %d", s.Len())
	}
}

// TestBounds: the most counters, log entries and reservations a store
// can hold, as its doc says: MaxKeys and MaxLogEntries, plus one counter
// or full log a shard, and MaxReservations.
func TestBounds(t *testing.T) {
	s := New(Config{MaxKeys: 4096, MaxLogEntries: 50_000, MaxReservations: 77})
	counters, entries, reservations := s.Bounds()
	if shards := len(s.shards); shards < 2 || counters != 4096+shards || entries != 50_000+shards*algorithms.MaxSlidingLogLimit || reservations != 77 {
		t.Errorf("Bounds() = %d, %d, %d with %d shards", counters, entries, reservations, shards)
	}
}

// remainingAfter is what a peek at a counter of kind a reports remaining
// under l after hits were charged: the rest of l.Count, or for a spacing,
// which counts one request whatever its hits, 0 once a request was
// admitted and 1 before.
func remainingAfter(a Algorithm, hits int64, l algorithms.Limit) int64 {
	switch {
	case a != Spacing:
		return l.Count - hits
	case hits > 0:
		return 0
	}
	return 1
}

// TestMergeNeverRefills merges a fresher (less charged) state into a more
// charged one: the charged one wins. (The fresh spacing was peeked at,
// never charged.)
func TestMergeNeverRefills(t *testing.T) {
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	for a := range NumAlgorithms {
		charged, fresh := New(Config{}), New(Config{})
		r := Request{Name: "api", Key: "k", Algorithm: a, Hits: 8, Now: t0, Limit: l}
		charged.Decide(&r)
		if r.Hits = 1; a == Spacing {
			r.Hits = 0
		}
		fresh.Decide(&r)
		for c := range fresh.Extract(func(string) bool { return true }) {
			if err := charged.Merge(c, t0, skew); err != nil {
				t.Fatal(err)
			}
		}
		r.Hits = 0
		if d, want := charged.Decide(&r), remainingAfter(a, 8, l); d.Remaining != want {
			t.Errorf("%s: after merging a fresher state, %d remaining, want %d", a, d.Remaining, want)
		}
	}
}

// encodeState returns s's encoding.
func encodeState(t *testing.T, s interface{ AppendBinary([]byte) ([]byte, error) }) []byte {
	t.Helper()
	b, err := s.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMergeRefuses offers the store counters that are impossible, each
// on an empty store and over an existing counter: every one is refused
// with the right sentinel and changes nothing.
func TestMergeRefuses(t *testing.T) {
	perSec := algorithms.Limit{Count: 1, Period: time.Second}
	minute := algorithms.Limit{Count: 10, Period: time.Minute}
	now := t0.UnixNano()
	good := Counter{Name: "api", Key: "k", Algorithm: TokenBucket, Limit: perSec, Last: now,
		State: encodeState(t, &algorithms.TokenBucket{Full: now + 1e9})}
	var log algorithms.SlidingLog
	log.Append(now+int64(time.Hour), 1)
	for _, tc := range []struct {
		name string
		edit func(c *Counter)
		want error
	}{
		{"unknown algorithm", func(c *Counter) { c.Algorithm = 6 }, ErrBadCounter},
		{"empty name", func(c *Counter) { c.Name = "" }, ErrBadCounter},
		{"name with NUL", func(c *Counter) { c.Name = "a\x00b" }, ErrBadCounter},
		{"name too long", func(c *Counter) { c.Name = strings.Repeat("n", MaxNameLen+1) }, ErrBadCounter},
		{"empty key", func(c *Counter) { c.Key = "" }, ErrBadCounter},
		{"key too long", func(c *Counter) { c.Key = strings.Repeat("k", MaxKeyLen+1) }, ErrBadCounter},
		{"invalid limit", func(c *Counter) { c.Limit.Count = 0 }, ErrBadCounter},
		{"sliding log over its maximum", func(c *Counter) {
			c.Algorithm, c.Limit.Count = SlidingLog, algorithms.MaxSlidingLogLimit+1
			c.State = encodeState(t, new(algorithms.SlidingLog))
		}, ErrBadCounter},
		{"last in the future", func(c *Counter) { c.Last = now + int64(time.Hour) }, ErrBadCounter},
		{"last negative", func(c *Counter) { c.Last = -1 }, ErrBadCounter},
		{"state of another algorithm", func(c *Counter) { c.State = encodeState(t, &algorithms.GCRA{}) }, ErrBadCounter},
		{"state truncated", func(c *Counter) { c.State = c.State[:5] }, ErrBadCounter},
		{"state of an unknown version", func(c *Counter) { c.State = append([]byte{9}, c.State[1:]...) }, ErrUnknownVersion},
		{"token bucket a year ahead", func(c *Counter) {
			c.State = encodeState(t, &algorithms.TokenBucket{Full: t0.Add(365 * 24 * time.Hour).UnixNano()})
		}, ErrBadCounter},
		{"fixed window above its limit", func(c *Counter) {
			c.Algorithm, c.Limit = FixedWindow, minute
			c.State = encodeState(t, &algorithms.FixedWindow{Start: now, Count: 12})
		}, ErrBadCounter},
		{"log entry in the future", func(c *Counter) {
			c.Algorithm, c.Limit = SlidingLog, minute
			c.State = encodeState(t, &log)
		}, ErrBadCounter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.edit(&c)
			empty := New(Config{})
			if err := empty.Merge(c, t0, skew); !errors.Is(err, tc.want) {
				t.Fatalf("Merge = %v, want %v", err, tc.want)
			}
			if empty.Len() != 0 {
				t.Errorf("a refused counter was inserted: Len = %d", empty.Len())
			}
			held := New(Config{})
			if err := held.Merge(good, t0, skew); err != nil {
				t.Fatal(err)
			}
			_ = held.Merge(c, t0, skew)
			if got := first(t, held); got.Last != good.Last || string(got.State) != string(good.State) || got.Limit != good.Limit {
				t.Errorf("a refused counter changed the held one to %+v", got)
			}
		})
	}
}

func first(t *testing.T, s *Store) Counter {
	t.Helper()
	for c := range s.Counters() {
		return c
	}
	t.Fatal("store is empty")
	return Counter{}
}

// TestMergedIdleCounterIsDropped: when a merged counter is back to full
// follows from its state and limit, not from anything the sender says.
func TestMergedIdleCounterIsDropped(t *testing.T) {
	s := New(Config{MaxKeys: 1000}) // one shard
	l := algorithms.Limit{Count: 2, Period: time.Second}
	c := Counter{Name: "api", Key: "moved", Algorithm: TokenBucket, Limit: l, Last: t0.UnixNano(),
		State: encodeState(t, &algorithms.TokenBucket{Full: t0.Add(time.Second).UnixNano()})}
	if err := s.Merge(c, t0, skew); err != nil {
		t.Fatal(err)
	}
	r := req("other", 1, 999*time.Millisecond)
	s.Decide(&r)
	if s.Len() != 2 {
		t.Fatalf("Len = %d before the moved counter is full, want 2", s.Len())
	}
	r = req("third", 1, time.Second)
	s.Decide(&r)
	for c := range s.Counters() {
		if c.Key == "moved" {
			t.Errorf("the moved counter, full again, was not dropped as idle")
		}
	}
}

// TestHolds: a counter is held by name, key and algorithm, and asking
// neither creates nor charges one.
func TestHolds(t *testing.T) {
	s := New(Config{})
	fill(s)
	held := Request{Name: "api", Key: "k3", Algorithm: SlidingLog, Now: t0}
	for _, tc := range []struct {
		r    Request
		want bool
	}{
		{held, true},
		{Request{Name: "api", Key: "k20", Algorithm: SlidingLog}, false},
		{Request{Name: "other", Key: "k3", Algorithm: SlidingLog}, false},
		{Request{Name: "api", Key: "k3", Algorithm: NumAlgorithms}, false},
	} {
		if got := s.Holds(&tc.r); got != tc.want {
			t.Errorf("Holds(%s/%s, %v) = %v, want %v", tc.r.Name, tc.r.Key, tc.r.Algorithm, got, tc.want)
		}
	}
	if n := s.Len(); n != 20*int(NumAlgorithms) {
		t.Errorf("store holds %d counters after Holds, want %d", n, 20*NumAlgorithms)
	}
	held.Limit, held.Hits = algorithms.Limit{Count: 10, Period: time.Minute}, 6
	if d := s.Decide(&held); !d.Allowed || d.Remaining != 0 {
		t.Errorf("the counter after Holds: %+v; want its 4 hits kept, 6 more admitted to 0 remaining", d)
	}
}

// TestTakeOut: a counter is taken out whole, once, and goes on where it
// stopped in another store.
func TestTakeOut(t *testing.T) {
	s := New(Config{})
	fill(s)
	r := Request{Name: "api", Key: "k3", Algorithm: TokenBucket, Now: t0}
	out := s.TakeOut(&r)
	if len(out) != 1 || out[0].Key != "k3" || out[0].Algorithm != TokenBucket {
		t.Fatalf("TakeOut = %+v; want k3's token bucket", out)
	}
	c := out[0]
	if s.Holds(&r) || s.Len() != 20*int(NumAlgorithms)-1 {
		t.Errorf("after TakeOut the store holds k3: %v, %d counters; want false, %d", s.Holds(&r), s.Len(), 20*NumAlgorithms-1)
	}
	if again := s.TakeOut(&r); len(again) != 0 {
		t.Error("a counter was taken out twice")
	}
	other := New(Config{})
	other.Restore([]Counter{c})
	r.Limit, r.Hits = algorithms.Limit{Count: 10, Period: time.Minute}, 6
	if d := other.Decide(&r); !d.Allowed || d.Remaining != 0 {
		t.Errorf("the counter taken out, elsewhere: %+v; want its 4 hits kept, 6 more admitted to 0 remaining", d)
	}
}

// TestHeldDecidesOnlyOnACounterHere: a request that may be decided only
// on a counter the store holds (Held) decides nothing when it holds none,
// by Try, TryAll and Reserve alike (ErrNotHeld, and no counter made), and
// is decided as any other when it holds one.
func TestHeldDecidesOnlyOnACounterHere(t *testing.T) {
	s := New(Config{})
	minute := algorithms.Limit{Count: 10, Period: time.Minute}
	absent := Request{Name: "api", Key: "gone", Algorithm: TokenBucket, Limit: minute, Hits: 1, Now: t0, Held: true}
	if _, err := s.Try(&absent); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Try without the counter: %v, want ErrNotHeld", err)
	}
	out := make([]algorithms.Decision, 2)
	if err := s.TryAll([]Request{absent, absent}, out); !errors.Is(err, ErrNotHeld) || out[0].Allowed {
		t.Errorf("TryAll without the counter: %v, %+v; want ErrNotHeld, nothing admitted", err, out)
	}
	if _, _, err := s.Reserve(&absent, time.Minute); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Reserve without the counter: %v, want ErrNotHeld", err)
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("the store holds %d counters after checks that decided nothing, want 0", n)
	}
	here := absent
	here.Held = false
	s.Decide(&here)
	if d, err := s.Try(&absent); err != nil || !d.Allowed || d.Remaining != 8 {
		t.Errorf("Try with the counter here: %+v, %v; want admitted, 8 left", d, err)
	}
}
