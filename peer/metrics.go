package peer

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Pool's Prometheus metrics. Without a Registerer they still
// count, unseen, so the hot path has no nil checks. The per-mode children
// are resolved once, so observing costs no label lookup.
type metrics struct {
	batchSize prometheus.Histogram
	modes     [2]modeMetrics // indexed by mode
}

// mode says how a check was forwarded; it is the "mode" label.
type mode int

const (
	batched mode = iota
	unbatched
)

func (m mode) String() string {
	if m == batched {
		return "batched"
	}
	return "unbatched"
}

type modeMetrics struct {
	duration prometheus.Observer
	errors   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	batchSize := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ringlimit_peer_batch_size",
		Help:    "Check items per batched Forward RPC.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 11), // 1 … 1024
	})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ringlimit_peer_forward_duration_seconds",
		Help:    "Time to forward one check to its owner and get the answer, by mode (batched or unbatched).",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16), // 50µs … 1.6s
	}, []string{"mode"})
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringlimit_peer_forward_errors_total",
		Help: "Checks that could not be forwarded to their owner, by mode (batched or unbatched).",
	}, []string{"mode"})
	if reg != nil {
		reg.MustRegister(batchSize, duration, errs)
	}
	m := &metrics{batchSize: batchSize}
	for _, md := range []mode{batched, unbatched} {
		m.modes[md] = modeMetrics{
			duration: duration.WithLabelValues(md.String()),
			errors:   errs.WithLabelValues(md.String()),
		}
	}
	return m
}

// forwarded records one forwarded check that started at start.
func (m *metrics) forwarded(md mode, start time.Time, err error) {
	mm := m.modes[md]
	mm.duration.Observe(time.Since(start).Seconds())
	if err != nil {
		mm.errors.Inc()
	}
}
