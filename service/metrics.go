package service

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/limiter"
)

// metrics are the service's Prometheus metrics. Labels are enums only:
// never a key or a name, which would grow without bound.
type metrics struct {
	// checks holds every series of ringlimit_checks_total, made up front so
	// that counting a check is an index and an atomic add, not a look-up.
	checks [limiter.NumAlgorithms][pb.Behavior_LOCAL + 1][numDecided][2]prometheus.Counter
	// forwardedChecks counts, by behavior, checks sent to their owner,
	// which decides and counts them in its own checks.
	forwardedChecks [pb.Behavior_LOCAL + 1]prometheus.Counter
	invalidItems    *prometheus.CounterVec
	forwardErrors   prometheus.Counter
	failovers       prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) metrics {
	checks := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringlimit_checks_total",
		Help: "Checks decided on this node, by algorithm, behavior, route (local, global, fallback, escrow: refused in strict mode, see docs/strict.md) and status. A forwarded check is counted once, by the owner that decided it.",
	}, []string{"algorithm", "behavior", "route", "status"})
	forwarded := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringlimit_forwarded_checks_total",
		Help: "Checks this node sent to their owner, which decided them, by behavior.",
	}, []string{"behavior"})
	m := metrics{
		invalidItems: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_invalid_items_total",
			Help: "Check items refused as invalid, by the field at fault.",
		}, []string{"field"}),
		forwardErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_forward_fallbacks_total",
			Help: "Forwards that failed (owner unreachable) or were not sent (owner suspect), so that this node decided locally with its share of the limit.",
		}),
		failovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_failover_checks_total",
			Help: "Checks whose owner could not be reached, sent to (or decided on) the key's heir, which decides them on its replica with the whole limit; those whose heir could not be reached either are then counted in ringlimit_forward_fallbacks_total.",
		}),
	}
	if reg != nil {
		reg.MustRegister(checks, forwarded, m.invalidItems, m.forwardErrors, m.failovers)
	}
	for b := range m.forwardedChecks {
		m.forwardedChecks[b] = forwarded.WithLabelValues(pb.Behavior(b).String())
	}
	for a := range m.checks {
		for b := range m.checks[a] {
			for r := range m.checks[a][b] {
				for st := range m.checks[a][b][r] {
					m.checks[a][b][r][st] = checks.WithLabelValues(limiter.Algorithm(a).String(), pb.Behavior(b).String(),
						routeKind(r).String(), pb.Status(st).String())
				}
			}
		}
	}
	return m
}

func (m *metrics) checked(a limiter.Algorithm, b pb.Behavior, r routeKind, allowed bool) {
	status := pb.Status_UNDER_LIMIT
	if !allowed {
		status = pb.Status_OVER_LIMIT
	}
	m.checks[a][b][r][status].Inc()
}

func (m *metrics) forwarded(b pb.Behavior) { m.forwardedChecks[b].Inc() }

func (m *metrics) invalid(err error) {
	field := "other"
	var fe *checks.FieldError
	if errors.As(err, &fe) {
		field = fe.Field
	}
	m.invalidItems.WithLabelValues(field).Inc()
}
