package handoff

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/limiter"
)

// TestHandOffCountsBytes: ringlimit_handoff_bytes_total counts the bytes
// of the records an owner took, on both sides, and not those it refused
// (a counter last evaluated beyond the receiver's clock).
func TestHandOffCountsBytes(t *testing.T) {
	ma, mb := newMembers("a", "a", "b"), newMembers("b", "a", "b")
	d := &delivering{nodes: map[string]*Node{}}
	sa := limiter.New(limiter.Config{})
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	a := New(Config{Store: sa, Cluster: ma, Peers: d, MaxClockSkew: time.Second, Registerer: regA})
	d.nodes["a"] = a
	d.nodes["b"] = New(Config{Store: limiter.New(limiter.Config{}), Cluster: mb, Peers: d, MaxClockSkew: time.Second, Registerer: regB})
	r := ma.Ring()
	now := time.Now()
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	var keys []string
	for i := 0; len(keys) < 3; i++ {
		if o, _ := r.Owner(fmt.Sprint("k", i)); o.Name == "b" {
			keys = append(keys, fmt.Sprint("k", i))
		}
	}
	var want int
	for i, at := range []time.Time{now, now, now.Add(time.Hour)} { // the last is beyond b's clock: refused
		key := keys[i]
		sa.Decide(&limiter.Request{Name: "api", Key: key, Algorithm: limiter.GCRA, Hits: 1, Limit: l, Now: at})
		if i < 2 {
			c := limiter.Counter{Name: "api", Key: key, Algorithm: limiter.GCRA, Limit: l, Last: at.UnixNano()}
			for held := range sa.Counters() {
				if held.Key == key {
					c = held
				}
			}
			b, err := c.AppendBinary(nil)
			if err != nil {
				t.Fatal(err)
			}
			want += len(b)
		}
	}
	if sent := a.HandOff(t.Context()); sent != 2 {
		t.Fatalf("handed off %d counters, want 2 (the third refused)", sent)
	}
	sentBytes := testutil.ToFloat64(a.metrics.bytes.WithLabelValues("sent"))
	gotBytes := testutil.ToFloat64(d.nodes["b"].metrics.bytes.WithLabelValues("received"))
	if sentBytes != float64(want) || gotBytes != float64(want) {
		t.Errorf("bytes sent %v, received %v; want %d each, the records taken", sentBytes, gotBytes, want)
	}
}
