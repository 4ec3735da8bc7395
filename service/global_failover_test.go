package service

import (
	"testing"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
)

// TestGlobalFailoverKeepsGrantsReserved: node-2 owns a GLOBAL key whose
// heir is node-1, and has lent node-0 and node-1 a grant each. When node-2
// crashes, the nodes admit what is left of their grants, and node-1, as
// heir, decides the other checks on the replicated counter less those
// grants, which it knows from node-2's last broadcast; once the ring drops
// node-2, node-1 owns the key and charges the nodes' unreported hits in
// full. Over the whole run the cluster admits exactly the limit. (Before:
// shares on each node while node-2 was unreachable, and only a share of
// the unreported hits charged after: 100 + 64 + 16 admitted.)
func TestGlobalFailoverKeepsGrantsReserved(t *testing.T) {
	const limit = 100
	c, svcs := newFakeCluster(3)
	item := globalItem(c.keyInheritedBy(2, 1))
	item.Limit = limit
	admitted := 0
	take := func(s *Service) *pb.CheckResult {
		r := check(t, s, item)
		if r.Status == pb.Status_UNDER_LIMIT {
			admitted++
		}
		return r
	}
	take(svcs[0]) // no grants yet: decided by node-2, and each asks for one
	take(svcs[1])
	syncRound(svcs) // node-2 lends each a share of the 98 left, and tells node-1 so
	if sent := svcs[2].custody.Replicate(t.Context()); sent != 1 {
		t.Fatalf("node-2 replicated %d counters, want 1", sent)
	}

	c.down["peer-2"] = true
	failover := 0
	for i := range 3 * limit {
		r := take(svcs[i%2])
		switch r.Metadata[MetadataDecidedBy] {
		case routeFailover:
			failover++
		case "":
		default:
			t.Fatalf("check %d with node-2 down: %v; want decided from a grant or by the heir", i, r)
		}
	}
	if admitted != limit || failover == 0 {
		t.Errorf("admitted %d with node-2 down (%d checks decided by its heir), want exactly the limit %d", admitted, failover, limit)
	}

	// node-2 leaves the ring: node-1 owns the key and inherits node-2's
	// grants; the nodes report the hits they admitted from them.
	c.ring = c.ring.Without("node-2")
	syncRound(svcs)
	syncRound(svcs)
	peek := globalItem(item.Key)
	peek.Limit, peek.Hits = limit, new(int64)
	if r := check(t, svcs[1], peek); r.Remaining != 0 {
		t.Errorf("the new owner's counter has %d remaining after the whole limit was admitted, want 0", r.Remaining)
	}
	for i := range limit {
		take(svcs[i%2])
		if i%10 == 0 {
			syncRound(svcs)
		}
	}
	if admitted != limit {
		t.Errorf("admitted %d in all, want exactly the limit %d", admitted, limit)
	}
}

// TestGlobalHeirChargesInheritedGrants: the nodes spend their grants
// from node-2, the owner, which admits the rest itself; then node-2
// crashes before the nodes report what they admitted. Its counter reached
// node-1, its heir, by replication, and its grants by its last broadcast.
// Once the ring drops node-2, the nodes' reports to node-1 are charged in
// full, up to what their grants had left, not only a share of what the
// counter has not lent: nothing more is admitted over the run than the
// limit. (Charged only a share, 11 more were admitted.)
func TestGlobalHeirChargesInheritedGrants(t *testing.T) {
	const limit = 90
	c, svcs := newFakeCluster(3)
	item := globalItem(c.keyInheritedBy(2, 1))
	item.Limit = limit
	admitted := 0
	take := func(s *Service) {
		if check(t, s, item).Status == pb.Status_UNDER_LIMIT {
			admitted++
		}
	}
	take(svcs[0]) // decided by node-2; both ask for a grant
	take(svcs[1])
	syncRound(svcs)
	for i := range limit {
		take(svcs[i%2]) // from the grants, then by node-2
	}
	svcs[2].custody.Replicate(t.Context())
	c.down["peer-2"] = true
	c.ring = c.ring.Without("node-2")
	for round := range 10 {
		syncRound(svcs)
		for i := range 10 {
			take(svcs[(round+i)%2])
		}
	}
	if admitted != limit {
		t.Errorf("admitted %d in all, want exactly the limit %d", admitted, limit)
	}
}

// TestPeerAttackHeirGrants: what an owner's broadcast says of other nodes'
// grants is kept by the key's heir only if it is possible. Broadcasts to
// node-1, the heir of a key node-2 owns, over real gRPC: from a stranger
// (refused whole), from a member that is not the owner, with a node
// charged more than it was lent or a negative epoch (rejected and counted,
// keeping nothing), and with a grant to a node that is not a member
// (ignored). With node-2 down, node-1 decides the key on its replica with
// nothing reserved: the 9 hits left are admitted, no fewer.
func TestPeerAttackHeirGrants(t *testing.T) {
	c, svcs, reg := newFakeClusterMetered(3, 1)
	item := globalItem(c.keyInheritedBy(2, 1))
	item.Limit = 10
	check(t, svcs[2], item)
	svcs[2].custody.Replicate(t.Context())

	client := servePeer(t, svcs[1], nil)
	state := func(grants ...*peerpb.GlobalGrant) []*peerpb.GlobalState {
		return []*peerpb.GlobalState{{Name: item.Name, Key: item.Key, Limit: 10, Remaining: 9, Members: 3,
			ResetTimeMs: t0.UnixMilli(), Grants: grants}}
	}
	if _, err := client.UpdateGlobals(t.Context(), &peerpb.GlobalUpdateRequest{From: "mallory",
		States: state(&peerpb.GlobalGrant{Node: "node-0", Granted: 9, Epoch: 1})}); err == nil {
		t.Error("a stranger's broadcast was taken")
	}
	for _, attack := range []struct {
		from  string
		grant *peerpb.GlobalGrant
	}{
		{"node-0", &peerpb.GlobalGrant{Node: "node-0", Granted: 9, Epoch: 1}},              // not the key's owner
		{"node-2", &peerpb.GlobalGrant{Node: "node-0", Granted: 5, Received: 9, Epoch: 1}}, // charged more than lent
		{"node-2", &peerpb.GlobalGrant{Node: "node-0", Granted: 9, Received: -1, Epoch: 1}},
		{"node-2", &peerpb.GlobalGrant{Node: "node-0", Granted: 9, Epoch: -1}},
		{"node-2", &peerpb.GlobalGrant{Node: "mallory", Granted: 9, Epoch: 1}}, // not a member: ignored
	} {
		if _, err := client.UpdateGlobals(t.Context(), &peerpb.GlobalUpdateRequest{From: attack.from, States: state(attack.grant)}); err != nil {
			t.Errorf("broadcast from %s: %v, want taken and its state rejected or ignored", attack.from, err)
		}
	}
	if got := metricSum(t, reg, "ringlimit_peer_rejected_total", "kind", "global_state", "reason", "not_owner"); got != 1 {
		t.Errorf("states from a non-owner counted %v, want 1", got)
	}
	if got := metricSum(t, reg, "ringlimit_peer_rejected_total", "kind", "global_state", "reason", "invalid"); got != 3 {
		t.Errorf("impossible grants counted %v, want 3", got)
	}

	c.down["peer-2"] = true
	admitted := 0
	for range 20 {
		if check(t, svcs[1], item).Status == pb.Status_UNDER_LIMIT {
			admitted++
		}
	}
	if admitted != 9 {
		t.Errorf("the heir admitted %d of the 9 hits left, with nothing lent by a possible broadcast", admitted)
	}
}
