package top

import (
	"fmt"
	"hash/maphash"
	"strings"
	"testing"
	"time"
)

var seed = maphash.MakeSeed()

func add(s *Sketch, key string, n uint64) {
	s.Add(maphash.String(seed, key), key, n)
}

// While a sketch has seen at most its capacity of distinct keys, every
// count is exact: the theory's first guarantee.
func TestSketchExactWithinCapacity(t *testing.T) {
	s := NewSketch(8)
	want := map[string]uint64{}
	for i := range 1000 {
		k := fmt.Sprintf("k%d", i*7%8)
		n := uint64(i%3 + 1)
		add(s, k, n)
		want[k] += n
	}
	got := s.Counts()
	if len(got) != 8 {
		t.Fatalf("%d keys, want 8", len(got))
	}
	for i, c := range got {
		if c.Count != want[c.Key] || c.Error != 0 {
			t.Errorf("%s: count %d error %d, want %d exactly", c.Key, c.Count, c.Error, want[c.Key])
		}
		if i > 0 && got[i-1].Count < c.Count {
			t.Errorf("not sorted: %v before %v", got[i-1], c)
		}
	}
	if s.Total() != sumOf(want) {
		t.Errorf("total %d, want %d", s.Total(), sumOf(want))
	}
}

func sumOf(m map[string]uint64) (n uint64) {
	for _, v := range m {
		n += v
	}
	return n
}

// Beyond its capacity: every key counted more than total/k times is in the
// sketch, each count lies in [true, true+error], and the error is at most
// total/k (the guarantees of space-saving).
func TestSketchHeavyHittersUnderFlood(t *testing.T) {
	const k = 16
	s := NewSketch(k)
	truth := map[string]uint64{}
	for i := range 20000 {
		key := fmt.Sprintf("flood:%d", i) // every one distinct
		if i%4 == 0 {
			key = "hot:a"
		} else if i%10 == 1 {
			key = "hot:b"
		}
		add(s, key, 1)
		truth[key]++
	}
	total := s.Total()
	counts := s.Counts()
	if len(counts) != k {
		t.Fatalf("%d keys, want %d", len(counts), k)
	}
	seen := map[string]Count{}
	for _, c := range counts {
		seen[c.Key] = c
		if c.Count < truth[c.Key] || c.Count-c.Error > truth[c.Key] {
			t.Errorf("%s: count %d error %d, true count %d outside [count-error, count]", c.Key, c.Count, c.Error, truth[c.Key])
		}
		if c.Error > total/k {
			t.Errorf("%s: error %d above total/k = %d", c.Key, c.Error, total/k)
		}
	}
	for key, n := range truth {
		if n > total/k {
			if _, ok := seen[key]; !ok {
				t.Errorf("%s counted %d times (> %d) is missing", key, n, total/k)
			}
		}
	}
	if counts[0].Key != "hot:a" || counts[1].Key != "hot:b" {
		t.Errorf("top two %q %q, want hot:a hot:b", counts[0].Key, counts[1].Key)
	}
}

// A flood of distinct keys, long ones included, takes no memory beyond the
// sketch's capacity: its entries and index stay at k, and keys are kept
// by their first MaxKeyBytes.
func TestSketchBoundedMemory(t *testing.T) {
	const k = 4
	s := NewSketch(k)
	long := strings.Repeat("x", 10000)
	for i := range 5000 {
		add(s, fmt.Sprintf("%s%d", long, i), 1)
		if len(s.ents) > k || cap(s.ents) != k || len(s.index) > k || len(s.heap) > k {
			t.Fatalf("after %d keys: %d entries (cap %d), %d indexed, heap %d; want at most %d", i+1, len(s.ents), cap(s.ents), len(s.index), len(s.heap), k)
		}
	}
	for _, c := range s.Counts() {
		if len(c.Key) != MaxKeyBytes || !c.Truncated {
			t.Errorf("kept %d bytes (truncated %v), want %d, truncated", len(c.Key), c.Truncated, MaxKeyBytes)
		}
	}
	if s.Total() != 5000 {
		t.Errorf("total %d, want 5000", s.Total())
	}
}

func TestSketchAddAllocatesNothing(t *testing.T) {
	s := NewSketch(8)
	keys := make([]string, 64)
	hashes := make([]uint64, 64)
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%d", i)
		hashes[i] = maphash.String(seed, keys[i])
	}
	i := 0
	if n := testing.AllocsPerRun(10000, func() {
		s.Add(hashes[i%64], keys[i%64], 1) // most take the smallest's slot
		i++
	}); n != 0 {
		t.Errorf("Add allocates %v times per call, want 0", n)
	}
}

func TestTrackerRecordAllocatesNothing(t *testing.T) {
	tr := New(Config{Names: 4, Keys: 8}, time.Unix(0, 0))
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%d", i)
	}
	names := []string{"a", "b", "c", "d", "e", "f"} // more names than slots
	i := 0
	if n := testing.AllocsPerRun(10000, func() {
		tr.Record(names[i%6], keys[i%64], i%3 == 0)
		i++
	}); n != 0 {
		t.Errorf("Record allocates %v times per call, want 0", n)
	}
}
