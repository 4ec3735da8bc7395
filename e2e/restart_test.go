package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// TestRollingRestartKeepsCounters restarts every node of three in turn, as
// a StatefulSet rollout does (SIGTERM, then a new process under the same
// name at a new address), and checks the counters survive.
func TestRollingRestartKeepsCounters(t *testing.T) {
	c := startCluster(t, 3)
	spend(t, c.nodes[0])
	for i := range c.nodes {
		old := c.nodes[i]
		old.signal(t, syscall.SIGTERM)
		if !old.wait(shutdownTimeout + 5*time.Second) {
			t.Fatalf("%s did not exit within %v of SIGTERM", old.name, shutdownTimeout+5*time.Second)
		}
		c.waitConverged(2)
		c.replace(i)
		c.waitConverged(3)
	}
	took := pollKept(t, "after a rolling restart of all 3 nodes", c.nodes...)
	t.Logf("counters kept %v after the last node came back", took.Round(time.Millisecond))
}

// TestCrashedNodeRejoinsUnderItsName: a node killed with SIGKILL comes back
// under its name at a new address (a crashed pod with a new IP). The
// others must take it back within seconds, not keep a split view in which
// both sides own its keys.
func TestCrashedNodeRejoinsUnderItsName(t *testing.T) {
	c := startCluster(t, 3)
	c.nodes[2].signal(t, syscall.SIGKILL)
	c.nodes[2].wait(5 * time.Second)
	c.waitConverged(2)

	restarted := time.Now()
	n := c.replace(2)
	took := c.waitConverged(3)
	t.Logf("%s rejoined %v after its restart", n.name, time.Since(restarted).Round(time.Millisecond))
	if took > 15*time.Second {
		t.Errorf("the restarted node took %v to rejoin, want < 15s", took)
	}
	// One view of the ring: checks alternating between an old node and
	// the restarted one admit exactly the limit.
	for k := range 30 {
		admitted := 0
		for i := range 20 {
			via := c.nodes[0]
			if i%2 == 1 {
				via = n
			}
			r, err := check(via, &pb.CheckItem{Name: "rejoin", Key: fmt.Sprint("k", k), Limit: 10, DurationMs: hour})
			if err != nil || r.Error != "" {
				t.Fatalf("check via %s: %v %v", via.name, r, err)
			}
			if r.Status == pb.Status_UNDER_LIMIT {
				admitted++
			}
		}
		if admitted != 10 {
			t.Errorf("key k%d: %d of 20 admitted with a limit of 10, want 10 (nodes disagree on the owner)", k, admitted)
		}
	}
}
