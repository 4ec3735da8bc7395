package service

import (
	"testing"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// TestFailoverPromotesReplicas: node-0's counters reach their heirs by
// replication. While node-0 is down but still in the ring, its keys are
// decided by their heirs, on the replicas, with the whole limit (a check
// through node-1 of a key whose heir is node-2 is relayed there); once
// the ring drops node-0, each key's new owner, its heir, goes on from the
// counter as node-0 left it.
func TestFailoverPromotesReplicas(t *testing.T) {
	c, svcs := newFakeCluster(3)
	keys := c.keysOwnedBy(0, 30)
	item := func(key string, hits int64) *pb.CheckItem {
		return &pb.CheckItem{Name: "api", Key: key, Limit: 10, DurationMs: 3_600_000, Hits: &hits}
	}
	for _, k := range keys {
		if r := check(t, svcs[1], item(k, 5)); r.Remaining != 5 {
			t.Fatalf("spending %s: %v", k, r)
		}
	}
	if sent := svcs[0].custody.Replicate(t.Context()); sent != len(keys) {
		t.Fatalf("node-0 replicated %d counters, want %d", sent, len(keys))
	}

	c.down["peer-0"] = true
	for _, k := range keys {
		r := check(t, svcs[1], item(k, 0))
		if r.Metadata[MetadataDecidedBy] != routeFailover || r.Remaining != 5 || r.Limit != 10 {
			t.Fatalf("%s with its owner down but in the ring: %v; want decided by its heir on the replica, 5 of 10 remaining", k, r)
		}
	}

	c.ring = c.ring.Without("node-0")
	for _, k := range keys {
		// Asked through either survivor, the new owner decides.
		for _, via := range svcs[1:] {
			if r := check(t, via, item(k, 0)); r.Remaining != 5 || r.Limit != 10 {
				t.Errorf("%s after node-0 left the ring, via %s: %v; want 5 of 10 remaining", k, via.cluster.LocalMember().Name, r)
			}
		}
	}
}
