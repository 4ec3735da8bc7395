package latency

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestHistogram(t *testing.T) {
	var h Histogram
	if h.Quantile(0.5) != 0 {
		t.Errorf("empty histogram: p50 %v, want 0", h.Quantile(0.5))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var vals []time.Duration
	for range 100_000 {
		// Log-uniform from 1ns to about 10s.
		v := time.Duration(math.Exp2(rng.Float64() * 33))
		vals = append(vals, v)
		h.Record(v)
	}
	slices.Sort(vals)
	for _, q := range []float64{0.001, 0.5, 0.9, 0.99, 0.999, 1} {
		exact := vals[max(int(math.Ceil(q*float64(len(vals))))-1, 0)]
		got := h.Quantile(q)
		if got < exact || float64(got-exact) > float64(exact)/64 {
			t.Errorf("quantile(%v) = %v, want within 1/64 above %v", q, got, exact)
		}
	}
	if h.Quantile(1) != vals[len(vals)-1] || h.Max() != vals[len(vals)-1] {
		t.Errorf("max %v, quantile(1) %v; want %v", h.max, h.Quantile(1), vals[len(vals)-1])
	}
	for v := range uint64(1 << 16) {
		if i := bucketOf(v); bucketTop(i) < v || (i > 0 && bucketTop(i-1) >= v) {
			t.Fatalf("%d falls in bucket %d of top %d, previous top %d", v, i, bucketTop(i), bucketTop(i-1))
		}
	}
}

func TestMerge(t *testing.T) {
	var a, b, all Histogram
	for i := range 1000 {
		d := time.Duration(i) * time.Microsecond
		all.Record(d)
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	a.Merge(&b)
	if a != all {
		t.Errorf("merged histogram differs from one that recorded everything")
	}
	if a.Count() != 1000 || a.Max() != 999*time.Microsecond {
		t.Errorf("count %d, max %v; want 1000, 999µs", a.Count(), a.Max())
	}
}

// metrics is a MetricReporter that keeps what it is given.
type metrics map[string]float64

func (m metrics) ReportMetric(n float64, unit string) { m[unit] = n }

func TestRecorderReport(t *testing.T) {
	var r Recorder
	empty := metrics{}
	r.Report(empty, time.Second, 1)
	if len(empty) != 0 {
		t.Errorf("empty recorder reported %v", empty)
	}
	// Two workers, 100 requests of 10 checks in 2s; latencies 1..100 µs.
	var w1, w2 []time.Duration
	for i := 1; i <= 100; i++ {
		if i%2 == 0 {
			w1 = append(w1, time.Duration(i)*time.Microsecond)
		} else {
			w2 = append(w2, time.Duration(i)*time.Microsecond)
		}
	}
	r.Add(w1)
	r.Add(w2)
	got := metrics{}
	r.Report(got, 2*time.Second, 10)
	// The histogram's bounds: 50µs and 99µs fall in buckets of width
	// 512ns and 1024ns, whose tops are reported.
	want := metrics{"checks/s": 500, "p50-µs": 50.175, "p99-µs": 99.327}
	for unit, w := range want {
		if math.Abs(got[unit]-w) > 0.001 {
			t.Errorf("%s = %v, want %v", unit, got[unit], w)
		}
	}
	// And they are the Histogram's, the one implementation.
	var h Histogram
	for _, d := range append(w1, w2...) {
		h.Record(d)
	}
	if p99 := float64(h.Quantile(0.99)) / 1e3; got["p99-µs"] != p99 {
		t.Errorf("Report's p99 %v differs from Histogram.Quantile's %v", got["p99-µs"], p99)
	}
}
