package service

import (
	"fmt"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
)

// plantSpent sends, over client as member from, a replica of a spent
// counter (10 a minute, full again a minute from t0) for each key.
func plantSpent(t *testing.T, client peerpb.PeerClient, from string, keys []string) {
	t.Helper()
	spent := make([]*peerpb.CounterState, len(keys))
	for i, k := range keys {
		spent[i] = &peerpb.CounterState{Counter: record(limiter.TokenBucket, "api", k, algorithms.Limit{Count: 10, Period: time.Minute},
			t0.UnixNano(), encoded(&algorithms.TokenBucket{Full: t0.Add(time.Minute).UnixNano()}))}
	}
	if accepted, refused := counterRPCs["Replicate"](t, client, from, spent); accepted != int64(len(keys)) || len(refused) != 0 {
		t.Fatalf("planting %d replicas: accepted %d, refused %v", len(keys), accepted, refused)
	}
}

// TestPeerAttackPlantedReplicas: a member replicates, as spent, 27 keys
// the receiver owns itself (over real gRPC, to the receiver's peer
// server). Then the ring changes, twice: another member leaves, then the
// sender itself. The keys stay as they were, the fresh ones full and the
// ones the owner's own checks had charged as those left them: a replica
// is promoted only for a key whose owner left or failed, and only the
// one that owner sent. (Issue 24: on main, all 27 turned OVER_LIMIT at
// the first ring change.)
func TestPeerAttackPlantedReplicas(t *testing.T) {
	c, svcs := newFakeCluster(3)
	client := servePeer(t, svcs[0], nil)
	without2 := c.ring.Without("node-2")
	var keys []string
	for k := 0; len(keys) < 27; k++ { // keys node-0 owns before and after the change
		key := keyOf(c, "node-0", fmt.Sprint("planted-", k))
		if o, _ := without2.Owner(key); o.Name == "node-0" {
			keys = append(keys, key)
		}
	}
	item := func(key string, hits int64) *pb.CheckItem {
		return &pb.CheckItem{Name: "api", Key: key, Limit: 10, DurationMs: 60_000, Hits: &hits}
	}
	want := map[string]int64{}
	for i, k := range keys {
		want[k] = 10
		if i%2 == 0 {
			want[k] = check(t, svcs[0], item(k, 3)).Remaining
		}
	}
	plantSpent(t, client, "node-1", keys)

	for _, step := range []struct {
		name   string
		change func()
	}{
		{"as planted", func() {}},
		{"after node-2 left the ring", func() { c.ring = without2 }},
		{"after the sender, node-1, left the ring too", func() { c.ring = c.ring.Without("node-1") }},
	} {
		step.change()
		svcs[0].RingChanged()
		spent := 0
		for _, k := range keys {
			if r := check(t, svcs[0], item(k, 0)); r.Remaining != want[k] {
				spent++
				t.Errorf("%s, %s: %v, want %d remaining as before", step.name, k, r, want[k])
			}
		}
		if spent > 0 {
			t.Fatalf("%s: %d of %d keys changed by planted replicas", step.name, spent, len(keys))
		}
	}
}

// TestPeerAttackPlantedReplicasFailover: a member plants spent replicas
// of keys another member owns at their heir. While the owner cannot be
// reached, the heir decides the keys (failover), on the owner's replica
// only: it has none, so the keys start full, and the planted ones stay
// unused. (On main, the heir decided them on the planted replicas: every
// check OVER_LIMIT.)
func TestPeerAttackPlantedReplicasFailover(t *testing.T) {
	c, svcs := newFakeCluster(3)
	client := servePeer(t, svcs[0], nil)
	without2 := c.ring.Without("node-2")
	var keys []string
	for k := 0; len(keys) < 5; k++ {
		key := keyOf(c, "node-2", fmt.Sprint("failover-", k))
		if h, _ := without2.Owner(key); h.Name == "node-0" {
			keys = append(keys, key)
		}
	}
	plantSpent(t, client, "node-1", keys)
	c.down["peer-2"] = true
	for _, k := range keys {
		r := check(t, svcs[0], &pb.CheckItem{Name: "api", Key: k, Limit: 10, DurationMs: 60_000})
		if r.Metadata[MetadataDecidedBy] != routeFailover || r.Status != pb.Status_UNDER_LIMIT || r.Remaining != 9 {
			t.Errorf("%s with its owner down: %v; want decided by failover on a fresh counter, 9 remaining", k, r)
		}
	}
}
