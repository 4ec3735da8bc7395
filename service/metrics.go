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
	checks       *prometheus.CounterVec
	invalidItems *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_checks_total",
			Help: "Checks decided, by algorithm, behavior and status.",
		}, []string{"algorithm", "behavior", "status"}),
		invalidItems: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_invalid_items_total",
			Help: "Check items refused as invalid, by the field at fault.",
		}, []string{"field"}),
	}
	if reg != nil {
		reg.MustRegister(m.checks, m.invalidItems)
	}
	return m
}

func (m *metrics) checked(a limiter.Algorithm, b pb.Behavior, allowed bool) {
	status := pb.Status_UNDER_LIMIT
	if !allowed {
		status = pb.Status_OVER_LIMIT
	}
	m.checks.WithLabelValues(a.String(), b.String(), status.String()).Inc()
}

func (m *metrics) invalid(err error) {
	field := "other"
	var fe *FieldError
	if errors.As(err, &fe) {
		field = fe.Field
	}
	m.invalidItems.WithLabelValues(field).Inc()
}
