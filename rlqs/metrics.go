package rlqs

import "github.com/prometheus/client_golang/prometheus"

// metrics are a Server's; registered on Config.Registerer when set.
type metrics struct {
	streams, buckets prometheus.Gauge
	refused          *prometheus.CounterVec
	assignments      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ringlimit_rlqs_streams", Help: "RLQS streams open on this node."}),
		buckets: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ringlimit_rlqs_buckets", Help: "Buckets of the RLQS streams open on this node."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ringlimit_rlqs_refused_total",
			Help: "RLQS streams, messages and bucket reports refused or ignored, by reason: streams (--rlqs-max-streams), buckets_per_stream (--rlqs-max-buckets-per-stream), invalid (a message that ended its stream), unsupported_policy, lease (a report its owner did not take)."}, []string{"reason"}),
		assignments: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ringlimit_rlqs_assignments_total",
			Help: "RLQS bucket actions sent, by kind: token_bucket, ALLOW_ALL, DENY_ALL, zero_ttl, abandon."}, []string{"kind"}),
	}
	if reg != nil {
		reg.MustRegister(m.streams, m.buckets, m.refused, m.assignments)
	}
	return m
}
