package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// replicated waits until n has sent a replica of every counter it holds to
// its heir, as its metrics say: what one --replicate-interval (100ms)
// achieves on an idle machine.
func replicated(t *testing.T, n *node) {
	t.Helper()
	poll(t, keepTimeout, n.name+" replicates every counter it holds", func() (bool, string) {
		held, err := metric(n, "ringlimit_counters")
		if err != nil {
			return false, err.Error()
		}
		sent, err := metric(n, "ringlimit_replication_counters_total", `direction="sent"`)
		if err != nil {
			return false, err.Error()
		}
		return held > 0 && sent >= held, fmt.Sprintf("holds %v counters, replicated %v", held, sent)
	})
	bytes, _ := metric(n, "ringlimit_replication_sent_bytes_total")
	batches, _ := metric(n, "ringlimit_replication_batches_total", `outcome="sent"`)
	t.Logf("%s replicated its counters in %v batches, %v bytes", n.name, batches, bytes)
}

// TestCrashedOwnersCountersSurvive: three nodes, 600 counters half spent;
// once the owner of a third of them has replicated them, it is killed
// with SIGKILL. Its keys' new owners promote their replicas: at least 99%
// of all counters are found half spent through either survivor. Then, when
// the crashed node comes back under its name, it does not bring back
// stale counters: the counters spent further meanwhile keep that spending,
// through every node.
func TestCrashedOwnersCountersSurvive(t *testing.T) {
	c := startCluster(t, 3)
	spend(t, c.nodes[0])
	victim := c.nodes[1]
	replicated(t, victim)

	victim.signal(t, syscall.SIGKILL)
	if !victim.wait(5 * time.Second) {
		t.Fatalf("%s did not exit after SIGKILL", victim.name)
	}
	conv := c.waitConverged(2)
	took := pollKept(t, "after the owner of a third was killed", c.nodes[0], c.nodes[2])
	t.Logf("the survivors dropped the crashed node %v after the kill; counters found %v after that",
		conv.Round(time.Millisecond), took.Round(time.Millisecond))
	promoted := 0.0
	for _, n := range []*node{c.nodes[0], c.nodes[2]} {
		p, err := metric(n, "ringlimit_replicas_promoted_total")
		if err != nil {
			t.Fatal(err)
		}
		promoted += p
	}
	if promoted < counters/10 {
		t.Errorf("%v replicas promoted on the survivors; the crashed node owned about %d counters", promoted, counters/3)
	}

	// Spend 3 more of each counter, then bring the crashed node back.
	const more = 3
	for lo := 0; lo < counters; lo += checkItemsMax {
		var items []*pb.CheckItem
		for i := lo; i < min(lo+checkItemsMax, counters); i++ {
			items = append(items, counterItem(i, more))
		}
		rs, err := checkMany(c.nodes[2], items)
		if err != nil {
			t.Fatal(err)
		}
		for j, r := range rs {
			if r.Error != "" || r.Remaining != counterLimit-counterSpent-more {
				t.Fatalf("spending %s again: %v", items[j].Key, r)
			}
		}
	}
	back := c.replace(1)
	c.waitConverged(3)
	pollKeptAt(t, "after the crashed node came back", counterLimit-counterSpent-more, back, c.nodes[0], c.nodes[2])
}
