// Package latency collects request latencies in Go benchmarks and reports
// throughput and percentiles as benchmark metrics, so that benchmarks of
// different transports report the same figures the same way.
package latency

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// Recorder collects latencies from concurrent workers. The zero value is
// ready; it is safe for concurrent use.
type Recorder struct {
	mu  sync.Mutex
	all []time.Duration
}

// Add records one worker's latencies; call it once per worker, at its end.
func (r *Recorder) Add(ds []time.Duration) {
	r.mu.Lock()
	r.all = append(r.all, ds...)
	r.mu.Unlock()
}

// Report adds checks/s (each request counted as checksPerRequest checks
// over elapsed), and the p50 and p99 request latency in µs, to b.
func (r *Recorder) Report(b *testing.B, elapsed time.Duration, checksPerRequest int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.all) == 0 {
		return
	}
	slices.Sort(r.all)
	q := func(p float64) float64 { return float64(r.all[int(p*float64(len(r.all)-1))].Microseconds()) }
	b.ReportMetric(float64(len(r.all)*checksPerRequest)/elapsed.Seconds(), "checks/s")
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
}
