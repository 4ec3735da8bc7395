package cluster

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are one Cluster's Prometheus metrics.
type metrics struct {
	members      prometheus.Gauge
	rebuilds     prometheus.Counter
	joinAttempts prometheus.Counter
	// unadmitted and admitFailures are admission's: alive members gossip
	// announces that have not proved their name (see admission).
	unadmitted    prometheus.Gauge
	admitFailures prometheus.Counter
	// gossipUDP and gossipTCP are countingTransport's.
	gossipUDP, gossipTCP prometheus.Counter
}

// newMetrics creates the metrics and registers them on reg, unless reg is nil.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		members: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_cluster_members",
			Help: "Members in this node's current ring, itself included.",
		}),
		rebuilds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_ring_rebuilds_total",
			Help: "Times this node rebuilt its ring because membership changed.",
		}),
		joinAttempts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_cluster_join_attempts_total",
			Help: "Attempts to join the cluster through the --join addresses.",
		}),
		unadmitted: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_cluster_members_unadmitted",
			Help: "Alive members announced by gossip and left out of the ring because their peer port has not presented a certificate naming them.",
		}),
		admitFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_cluster_admission_failures_total",
			Help: "Checks of a member's peer port that failed: no handshake, a certificate not from the cluster CA, or one that does not name the member.",
		}),
	}
	gossip := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringlimit_gossip_bytes_total",
		Help: "Bytes of gossip this node caused, by transport: udp counts the datagrams it sent, tcp both directions of the streams it opened (push/pull, fallback probes). Summed over the nodes, each byte on the wire is counted once.",
	}, []string{"transport"})
	m.gossipUDP, m.gossipTCP = gossip.WithLabelValues("udp"), gossip.WithLabelValues("tcp")
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.members, m.rebuilds, m.joinAttempts, m.unadmitted, m.admitFailures, gossip} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register cluster metrics: %w", err)
		}
	}
	return m, nil
}
