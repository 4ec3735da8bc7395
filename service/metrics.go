package service

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
)

// metrics are the service's Prometheus metrics. Labels are enums only:
// never a key or a name, which would grow without bound.
type metrics struct {
	// checks holds every series of ringlimit_checks_total, made up front so
	// that counting a check is an index and an atomic add, not a look-up.
	checks           [limiter.NumAlgorithms][pb.Behavior_LOCAL + 1][numRoutes][2]prometheus.Counter
	invalidItems     *prometheus.CounterVec
	forwardErrors    prometheus.Counter
	globalSyncLag    prometheus.Histogram
	globalSendErrors prometheus.Counter
	handedOff        *prometheus.CounterVec
	handOffRefused   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) metrics {
	checks := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringlimit_checks_total",
		Help: "Checks decided, by algorithm, behavior, route (local, forwarded, global, fallback) and status.",
	}, []string{"algorithm", "behavior", "route", "status"})
	m := metrics{
		invalidItems: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_invalid_items_total",
			Help: "Check items refused as invalid, by the field at fault.",
		}, []string{"field"}),
		forwardErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_forward_fallbacks_total",
			Help: "Forwards that failed (owner unreachable), so that this node decided locally with its share of the limit.",
		}),
		globalSyncLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ringlimit_global_sync_seconds",
			Help:    "Time one GLOBAL sync round took: hits sent to owners and owners' state broadcast.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
		globalSendErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_global_send_errors_total",
			Help: "GLOBAL reports or broadcasts that failed; reports are kept and sent again at the next sync.",
		}),
		handedOff: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_handoff_counters_total",
			Help: "Counters handed to their new owner after a ring change (direction=sent) or taken over from another node (direction=received).",
		}, []string{"direction"}),
		handOffRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_handoff_refused_total",
			Help: "Handed-off counters the new owner refused, by reason (unknown_version, invalid, unavailable): direction=sent counts this node's counters refused (and kept here), direction=received the counters this node refused.",
		}, []string{"direction", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(checks, m.invalidItems, m.forwardErrors, m.globalSyncLag, m.globalSendErrors, m.handedOff, m.handOffRefused)
	}
	for _, direction := range []string{"sent", "received"} {
		m.handedOff.WithLabelValues(direction) // exported as 0 before the first hand-off
		for _, reason := range []pb.Refusal_Reason{pb.Refusal_UNKNOWN_VERSION, pb.Refusal_INVALID, pb.Refusal_UNAVAILABLE} {
			m.handOffRefused.WithLabelValues(direction, refusedLabel(reason))
		}
	}
	for a := range m.checks {
		for b := range m.checks[a] {
			for r := range m.checks[a][b] {
				for st := range m.checks[a][b][r] {
					m.checks[a][b][r][st] = checks.WithLabelValues(limiter.Algorithm(a).String(), pb.Behavior(b).String(),
						route(r).String(), pb.Status(st).String())
				}
			}
		}
	}
	return m
}

func (m *metrics) checked(a limiter.Algorithm, b pb.Behavior, r route, allowed bool) {
	status := pb.Status_UNDER_LIMIT
	if !allowed {
		status = pb.Status_OVER_LIMIT
	}
	m.checks[a][b][r][status].Inc()
}

func (m *metrics) invalid(err error) {
	field := "other"
	var fe *FieldError
	if errors.As(err, &fe) {
		field = fe.Field
	}
	m.invalidItems.WithLabelValues(field).Inc()
}
