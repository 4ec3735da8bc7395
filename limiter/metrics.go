package limiter

import "github.com/prometheus/client_golang/prometheus"

// metrics are the store's Prometheus metrics. Without a Registerer they
// still count, unseen, so the hot path has no nil checks.
type metrics struct {
	evictions    prometheus.Counter
	idleDropped  prometheus.Counter
	logEvictions prometheus.Counter
	refused      prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, held func() int) metrics {
	m := metrics{
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_counters_evicted_total",
			Help: "Counters back to full (so losing nothing) evicted, least recently used first, because the store held --max-keys counters or its share of --memory-limit.",
		}),
		idleDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_counters_idle_dropped_total",
			Help: "Counters dropped because they were back to full, so carried no information.",
		}),
		logEvictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_sliding_logs_evicted_total",
			Help: "Sliding logs back to full evicted, least recently used first, because the logs held --max-log-entries entries.",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_counters_refused_total",
			Help: "Checks (and counters handed over or replicated) refused because the store held --max-keys counters, its share of --memory-limit or --max-log-entries, and every counter it could evict still held spent hits: new keys are refused rather than old debts forgiven.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.evictions, m.idleDropped, m.logEvictions, m.refused, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ringlimit_counters",
			Help: "Counters held in memory by this node.",
		}, func() float64 { return float64(held()) }))
	}
	return m
}
