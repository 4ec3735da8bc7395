package service

import (
	"bytes"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/ring"
)

// TestGroupSends: BATCHED forwards to one node share a send; UNBATCHED
// forwards, relays and pulls are sends of their own, unless the request
// is all-or-nothing, whose checks bound for one node the same way share
// one; a retry never shares a first try's send.
func TestGroupSends(t *testing.T) {
	type want struct {
		kind    routeKind
		to      string
		batched bool
		ks      []int
	}
	fwd := func(to ring.Member) route { return route{kind: routeForward, to: &to} }
	cases := []struct {
		name      string
		behaviors []pb.Behavior
		all       bool
		routes    []route
		retried   []bool
		want      []want
	}{
		{name: "batched by node",
			behaviors: []pb.Behavior{pb.Behavior_BATCHED, pb.Behavior_BATCHED, pb.Behavior_GLOBAL, pb.Behavior_BATCHED},
			routes:    []route{fwd(nodeB), fwd(nodeC), fwd(nodeB), fwd(nodeC)},
			want:      []want{{routeForward, "b", true, []int{0, 2}}, {routeForward, "c", true, []int{1, 3}}}},
		{name: "unbatched alone",
			behaviors: []pb.Behavior{pb.Behavior_UNBATCHED, pb.Behavior_UNBATCHED, pb.Behavior_BATCHED},
			routes:    []route{fwd(nodeB), fwd(nodeB), fwd(nodeB)},
			want:      []want{{routeForward, "b", false, []int{0}}, {routeForward, "b", false, []int{1}}, {routeForward, "b", true, []int{2}}}},
		{name: "relays and pulls alone",
			behaviors: []pb.Behavior{pb.Behavior_BATCHED, pb.Behavior_BATCHED, pb.Behavior_BATCHED},
			routes:    []route{{kind: routeRelay, to: &nodeB}, {kind: routeRelay, to: &nodeB}, {kind: routePull, to: &nodeB}},
			want:      []want{{routeRelay, "b", false, []int{0}}, {routeRelay, "b", false, []int{1}}, {routePull, "b", false, []int{2}}}},
		{name: "all-or-nothing: together by node and route, batched if any is",
			behaviors: []pb.Behavior{pb.Behavior_UNBATCHED, pb.Behavior_BATCHED, pb.Behavior_UNBATCHED, pb.Behavior_UNBATCHED, pb.Behavior_BATCHED},
			all:       true,
			routes:    []route{fwd(nodeB), fwd(nodeB), fwd(nodeC), {kind: routeRelay, to: &nodeB}, {kind: routeRelay, to: &nodeB}},
			want:      []want{{routeForward, "b", true, []int{0, 1}}, {routeForward, "c", false, []int{2}}, {routeRelay, "b", false, []int{3, 4}}}},
		{name: "retries apart from first tries",
			behaviors: []pb.Behavior{pb.Behavior_BATCHED, pb.Behavior_BATCHED},
			routes:    []route{fwd(nodeB), fwd(nodeB)},
			retried:   []bool{false, true},
			want:      []want{{routeForward, "b", true, []int{0}}, {routeForward, "b", true, []int{1}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var items []*pb.CheckItem
			for i, b := range tc.behaviors {
				items = append(items, planItem(fmt.Sprint("key-", i), b))
			}
			c := planCall(nil, tc.all, items...)
			ps := make([]pending, len(items))
			ks := make([]int, len(items))
			for j := range ps {
				ps[j].j, ks[j] = j, j
				if tc.retried != nil {
					ps[j].retried = tc.retried[j]
				}
			}
			var got []want
			for _, sd := range groupSends(c, ps, tc.routes, ks) {
				got = append(got, want{sd.kind, sd.to.Name, sd.batched, sd.ks})
				for i, k := range sd.ks {
					if sd.req.Requests[i] != items[k] || sd.req.All != tc.all {
						t.Errorf("send to %s carries %v (all %v), want item %d", sd.to.Name, sd.req.Requests[i], sd.req.All, k)
					}
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("sends %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestLongestPlanEndsInShare: a long way a check can go, one round each,
// ends in this node's share within maxRounds: its owner fails as the ring
// drops it; the key's new owner fails too; the relay to the new owner's
// heir fails; this node then reaches no member (it suspects them all) and
// is not the key's heir, so it decides with its share.
func TestLongestPlanEndsInShare(t *testing.T) {
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	c, svcs := newFakeClusterWith(4, func(i int) Config {
		if i == 0 {
			return Config{Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
		}
		return Config{}
	})
	without2 := c.ring.Without("node-2")
	var key string
	for k := 0; key == ""; k++ {
		key = fmt.Sprint("key-", k)
		o, _ := c.ring.Owner(key)
		n, _ := without2.Owner(key)
		h, _ := without2.Without(n.Name).Owner(key)
		if o.Name != "node-2" || n.Name != "node-3" || h.Name != "node-1" {
			key = ""
		}
	}
	var tried []string
	c.down = map[string]bool{"peer-1": true, "peer-2": true, "peer-3": true}
	c.onDown = func(addr string) {
		tried = append(tried, addr)
		c.ring = without2
	}
	r := check(t, svcs[0], &pb.CheckItem{Name: "api", Key: key, Limit: 30, DurationMs: 60_000})
	if r.Metadata[MetadataDecidedBy] != routeFallback.String() || r.Limit != 10 {
		t.Errorf("result %v, want decided by fallback with a share of 30 over 3 members", r)
	}
	if want := []string{"peer-2", "peer-3", "peer-1"}; !reflect.DeepEqual(tried, want) {
		t.Errorf("tried %v, want the owner, its successor, then the successor's heir: %v", tried, want)
	}
	if !strings.Contains(logs.String(), "owner=node-1") {
		t.Errorf("logged %q; want the share after the relay to node-1, the last member tried", logs.String())
	}
	for name, want := range map[string]float64{"ringlimit_forward_fallbacks_total": 1, "ringlimit_failover_checks_total": 1} {
		if got := metricSum(t, reg, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}
