package snapshot

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/peerpb"
)

type metrics struct {
	writes      *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	bytes       prometheus.Gauge
	written     prometheus.Gauge
	lastWritten prometheus.Gauge
	loaded      prometheus.Counter
	loadErrors  *prometheus.CounterVec
	refused     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_snapshot_writes_total",
			Help: "Snapshots written, by result: ok, failed (the last snapshot stays), canceled (abandoned as the node stopped).",
		}, []string{"result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ringlimit_snapshot_duration_seconds",
			Help:    "How long writing a snapshot (op=write) or loading one at start (op=load) took.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 9), // 1ms … 65s
		}, []string{"op"}),
		bytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_snapshot_bytes",
			Help: "Size of the last snapshot written, in bytes.",
		}),
		written: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_snapshot_counters_written",
			Help: "Counters in the last snapshot written (those not back to full).",
		}),
		lastWritten: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_snapshot_last_written_timestamp_seconds",
			Help: "When the last snapshot written whole began (Unix seconds): the counters on disk are at least that recent. 0 before the first.",
		}),
		loaded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_snapshot_counters_loaded_total",
			Help: "Counters loaded from the snapshot at start and merged into the store.",
		}),
		loadErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_snapshot_load_errors_total",
			Help: "Snapshot files refused at start, whole, by reason: foreign (not a snapshot, or another node's), version (an unknown format version), truncated, corrupt (checksum, lengths), too_large (beyond what the store could have written), not_regular (a FIFO, device, directory or symbolic link), io (could not be read); and loads stopped part way, the file kept: timeout (the load took longer than its bound, a minute), canceled (the node was stopping).",
		}, []string{"reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_snapshot_counters_refused_total",
			Help: "Counters in a snapshot that was read whole but refused one by one at load, as a hand-off would refuse them, by reason (invalid: impossible for its limit or this node's clock; unknown_version).",
		}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.writes, m.duration, m.bytes, m.written, m.lastWritten, m.loaded, m.loadErrors, m.refused)
	}
	// Every series exported before its first event, so that rates and
	// alerts see a 0 rather than nothing.
	for _, r := range []string{"ok", "failed", "canceled"} {
		m.writes.WithLabelValues(r)
	}
	for _, op := range []string{"write", "load"} {
		m.duration.WithLabelValues(op)
	}
	for _, r := range refusals {
		m.loadErrors.WithLabelValues(r.reason)
	}
	m.loadErrors.WithLabelValues("io")
	for _, r := range []peerpb.Refusal_Reason{peerpb.Refusal_INVALID, peerpb.Refusal_UNKNOWN_VERSION, peerpb.Refusal_UNAVAILABLE} {
		m.refused.WithLabelValues(checks.ReasonLabel(r))
	}
	return m
}
