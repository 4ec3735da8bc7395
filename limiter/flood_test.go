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
	most, _ := s.Bounds()
	if s.Len() > most {
		t.Errorf("%d counters held, more than the bound %d", s.Len(), most)
	}
	if got := testutil.ToFloat64(s.metrics.refused); refused == 0 || got != float64(refused) {
		t.Errorf("%d flood keys refused, the metric counts %v; want some, and the same", refused, got)
	}
}
