package limiter

import "github.com/prometheus/client_golang/prometheus"

// metrics are the store's Prometheus metrics. Without a Registerer they
// still count, unseen, so the hot path has no nil checks.
type metrics struct {
	evictions    prometheus.Counter
	idleDropped  prometheus.Counter
	logEvictions prometheus.Counter
	refused      prometheus.Counter
	// evictedOwing and debtsForgiven count what debts.go does.
	evictedOwing  prometheus.Counter
	debtsForgiven prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, held func() int, debts func() int64) metrics {
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
			Help: "Checks (and counters handed over or replicated) refused because the store held --max-log-entries sliding-log entries and every log it could evict still held spent hits, or, rarely, because the key's shard held no counter to evict.",
		}),
		evictedOwing: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_counters_evicted_owing_total",
			Help: "Counters still holding spent hits evicted, least recently used first, because the store held --max-keys counters or its share of --memory-limit and none was back to full: each one's debt is kept in a few bytes until it would be full again, and its checks are refused until then.",
		}),
		debtsForgiven: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_debts_forgiven_total",
			Help: "Debts of evicted counters forgiven, the soonest paid first, because both buckets a new debt could go to were full of debts still owed: the debts table (8 for each of --max-keys, or its share of --memory-limit) was nearly full.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.evictions, m.idleDropped, m.logEvictions, m.refused, m.evictedOwing, m.debtsForgiven, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ringlimit_counters",
			Help: "Counters held in memory by this node.",
		}, func() float64 { return float64(held()) }), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ringlimit_debts",
			Help: "Debts of evicted counters kept by this node (some perhaps paid already, until their slot is reused).",
		}, func() float64 { return float64(debts()) }))
	}
	return m
}
