// Package latency measures request latencies the one way ringlimit
// reports them, in `rlnode bench` and in Go benchmarks alike: durations go
// into a log-linear Histogram of fixed size, and a percentile is the upper
// bound of the bucket holding the value of nearest rank (ceil(q·n)), within
// 1/64 of the exact value and never above the maximum.
package latency

import (
	"sync"
	"time"
)

// Recorder collects latencies from concurrent workers for a benchmark.
// The zero value is ready; it is safe for concurrent use.
type Recorder struct {
	mu sync.Mutex
	h  Histogram
}

// Add records one worker's latencies; call it once per worker, at its end.
func (r *Recorder) Add(ds []time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range ds {
		r.h.Record(d)
	}
}

// MetricReporter is where Report writes: a *testing.B.
type MetricReporter interface {
	ReportMetric(n float64, unit string)
}

// Report adds checks/s (each request counted as checksPerRequest checks
// over elapsed), and the p50 and p99 request latency in µs, to b. It adds
// nothing when no latency was recorded.
func (r *Recorder) Report(b MetricReporter, elapsed time.Duration, checksPerRequest int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h.Count() == 0 {
		return
	}
	µs := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	b.ReportMetric(float64(r.h.Count()*int64(checksPerRequest))/elapsed.Seconds(), "checks/s")
	b.ReportMetric(µs(r.h.Quantile(0.50)), "p50-µs")
	b.ReportMetric(µs(r.h.Quantile(0.99)), "p99-µs")
}
