package node_test

import (
	"fmt"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/node/nodetest"
)

// TestALeavingNodeRelaysUntilTheOthersDropIt: a node that leaves keeps
// its peer port open until the others, which keep it in their rings for
// cluster.FailGrace after gossip tells them it left, have dropped it: the
// checks of its keys sent to the other node meanwhile are forwarded to it
// and relayed to their new owner, none decided by failover. Before, its
// peer port closed as soon as its last hand-off was done, and the other
// failed those checks over to the heir for about a second.
func TestALeavingNodeRelaysUntilTheOthersDropIt(t *testing.T) {
	a, _ := nodetest.Start(t, nodetest.Config("node-0"))
	conf := nodetest.Config("node-1")
	conf.Join = []string{a.Cluster().GossipAddr()}
	b, stopB := nodetest.Start(t, conf)
	for deadline := time.Now().Add(20 * time.Second); a.Cluster().Ring().Len() != 2 || b.Cluster().Ring().Len() != 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the two nodes' rings did not hold both within 20s")
		}
	}
	var keys []string
	for i := 0; len(keys) < 20; i++ {
		key := fmt.Sprintf("user:%d", i)
		if owner, _ := a.Cluster().Ring().Owner(key); owner.Name == "node-1" {
			keys = append(keys, key)
		}
	}
	c := checker(t, a)
	stopped := make(chan error, 1)
	began := time.Now()
	var stopTook time.Duration
	go func() { err := stopB(); stopTook = time.Since(began); stopped <- err }()

	// Until node-0 has dropped node-1 from its ring, and a little after.
	var dropped time.Time
	checked := 0
	for deadline := time.Now().Add(15 * time.Second); dropped.IsZero() || time.Since(dropped) < 300*time.Millisecond; {
		if time.Now().After(deadline) {
			t.Fatal("node-0 did not drop node-1 from its ring within 15s of its leave")
		}
		if dropped.IsZero() && !a.Cluster().Ring().Has("node-1") {
			dropped = time.Now()
		}
		key := keys[checked%len(keys)]
		resp, err := c.Check(t.Context(), &pb.CheckRequest{Requests: []*pb.CheckItem{
			{Name: "leave", Key: key, Limit: 1_000_000, DurationMs: 3_600_000}}})
		if err != nil {
			t.Fatalf("check %d of %s while node-1 left: %v", checked, key, err)
		}
		if by := resp.GetResponses()[0].GetMetadata()["decided_by"]; by != "" {
			t.Fatalf("check %d of %s while node-1 left decided_by %q, want its owner's (relayed)", checked, key, by)
		}
		checked++
	}
	if err := <-stopped; err != nil {
		t.Errorf("node-1's leave: %v", err)
	}
	t.Logf("%d checks while node-1 left, none failed over; dropped after %v, stop took %v", checked, dropped.Sub(began), stopTook)
}
