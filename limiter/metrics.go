package limiter

import "github.com/prometheus/client_golang/prometheus"

// metrics are the store's Prometheus metrics. Without a Registerer they
// still count, unseen, so the hot path has no nil checks.
type metrics struct {
	evictions    prometheus.Counter
	idleDropped  prometheus.Counter
	logEvictions prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, held func() int) metrics {
	m := metrics{
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_counters_evicted_total",
			Help: "Counters evicted, least recently used first, because the store held --max-keys counters.",
		}),
		idleDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_counters_idle_dropped_total",
			Help: "Counters dropped because they were back to full, so carried no information.",
		}),
		logEvictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_sliding_logs_evicted_total",
			Help: "Sliding logs evicted, least recently used first, because the logs of their shard held their share of --max-log-entries.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.evictions, m.idleDropped, m.logEvictions, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ringlimit_counters",
			Help: "Counters held in memory by this node.",
		}, func() float64 { return float64(held()) }))
	}
	return m
}
