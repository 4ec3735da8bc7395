package node

import (
	"context"
	"net/http"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/status"
	"github.com/ringlimit/ringlimit/top"
)

// httpHandler is the HTTP port: the faces of package api, with GET
// /v1/top and the status page of package status beside them.
func (n *Node) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", n.faces.Handler())
	status.New(status.Config{
		Local:   n.svc,
		Members: func() []api.Member { return apiMembers(n.members) },
		Ask: func(ctx context.Context, addr string, keys int) (top.Report, time.Duration, error) {
			return n.pool.Top(ctx, addr, n.conf.NodeName, keys)
		},
		Changes:        n.changes,
		HideKeys:       n.conf.HideKeys,
		Page:           n.conf.StatusPage,
		UnknownDomains: n.unknown.Domains,
	}).Register(mux)
	return mux
}

// readiness returns GET /readyz's answer (api.Config.Ready): not ready
// while this node's own peer certificate does not name it, which every
// other member's admission check would refuse, else the cluster's
// (cluster.Readiness).
func (n *Node) readiness() (bool, string) {
	if err := n.ownName(); err != nil {
		return false, "not ready: " + err.Error()
	}
	return n.members.Readiness()
}

// recordRing logs r in the ring changes the status page shows.
func (n *Node) recordRing(r *ring.Ring) {
	ms := r.Members()
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Name
	}
	n.changes.Record(time.Now(), names)
}
