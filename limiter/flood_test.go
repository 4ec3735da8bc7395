package limiter

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringlimit/ringlimit/algorithms"
)

// TestKeyFloodKeepsDebts is issue 24's key flood, in process: 200 users
// spend their limit, then 1.1 million distinct keys arrive at the
// default MaxKeys. On main the flood evicted the spent users' counters,
// least recently used first, and every one of them was admitted again;
// here the store refuses the keys it has no room for (ErrFull, counted)
// and no spent user is admitted.
func TestKeyFloodKeepsDebts(t *testing.T) {
	const spent, flood = 200, 1_100_000
	s := New(Config{})
	perHour := algorithms.Limit{Count: 5, Period: time.Hour}
	user := func(i int, hits int64, at time.Duration) Request {
		return Request{Name: "api", Key: fmt.Sprint("user:", i), Hits: hits, Now: t0.Add(at), Limit: perHour}
	}
	for i := range spent {
		r := user(i, perHour.Count, 0)
		if d := s.Decide(&r); !d.Allowed {
			t.Fatalf("user %d spending its limit: %+v", i, d)
		}
	}
	var refused int
	key := make([]byte, 0, 32)
	for i := range flood {
		key = strconv.AppendInt(append(key[:0], "flood:"...), int64(i), 10)
		r := Request{Name: "api", Key: string(key), Hits: 1, Now: t0.Add(time.Second + time.Duration(i)), Limit: perHour}
		if _, err := s.Try(&r); errors.Is(err, ErrFull) {
			refused++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	admitted := 0
	for i := range spent {
		r := user(i, 1, 2*time.Second)
		if d := s.Decide(&r); d.Allowed {
			admitted++
		}
	}
	if admitted > 0 {
		t.Errorf("%d of %d spent users admitted again after a flood of %d keys", admitted, spent, flood)
	}
	most, _, _ := s.Bounds()
	if s.Len() > most {
		t.Errorf("%d counters held, more than the bound %d", s.Len(), most)
	}
	if got := testutil.ToFloat64(s.metrics.refused); refused == 0 || got != float64(refused) {
		t.Errorf("%d flood keys refused, the metric counts %v; want some, and the same", refused, got)
	}
}

// TestMaxBytes: with MaxBytes the store holds counters within their
// accounted bytes, refusing beyond them as beyond MaxKeys, and its count
// of bytes follows every counter that leaves (hand-off, idle drop), back
// to zero when none is left.
func TestMaxBytes(t *testing.T) {
	perHour := algorithms.Limit{Count: 5, Period: time.Hour}
	key := func(i int) string { return fmt.Sprintf("%01000d", i) } // 1 KB keys
	probe := New(Config{})
	cost := probe.shards[0].tables[TokenBucket].cost(len(appendID(nil, RoleLimit, "api", key(0))))
	s := New(Config{MaxKeys: 1000, MaxBytes: 100 * cost}) // one shard
	refused := 0
	for i := range 300 {
		r := Request{Name: "api", Key: key(i), Hits: 1, Now: t0, Limit: perHour}
		if _, err := s.Try(&r); errors.Is(err, ErrFull) {
			refused++
		}
	}
	if s.Len() != 100 || refused != 200 || s.bytes.Load() != 100*cost {
		t.Errorf("%d counters held, %d refused, %d bytes accounted; want 100, 200 and %d", s.Len(), refused, s.bytes.Load(), 100*cost)
	}
	half := key(50)
	for range s.Extract(func(k string) bool { return k < half }) {
	}
	if s.Len() != 50 || s.bytes.Load() != 50*cost {
		t.Errorf("after extracting half: %d counters, %d bytes; want 50 and %d", s.Len(), s.bytes.Load(), 50*cost)
	}
	// Two hours on the rest are full again, and a new key's insert drops
	// them as idle, two at a time.
	for i := range 30 {
		r := Request{Name: "api", Key: "late", Hits: 0, Now: t0.Add(2*time.Hour + time.Duration(i)), Limit: perHour}
		s.Decide(&r)
		for range s.Extract(func(key string) bool { return key == "late" }) {
		}
	}
	if s.Len() != 0 || s.bytes.Load() != 0 {
		t.Errorf("every counter gone: %d counters, %d bytes accounted; want none", s.Len(), s.bytes.Load())
	}
}
