package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/ring"
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

// TestCrashedOwnerReturnsToItsCounters: 30 keys spent to their limit (10
// an hour) through two nodes of three; once the third, the owner of about
// a third of them, has replicated them to their heirs, it is killed with
// SIGKILL and started again under its name with --join, as a StatefulSet
// restarts a pod after an OOM kill. Once all three list three members,
// each key is checked once through each node: none of the 90 checks is
// admitted. A returning owner gets its counters back from its keys'
// heirs before it decides its keys; with a snapshot directory, merged
// with the older snapshot it loads (taken when the keys were half spent),
// and after the whole cluster is stopped and started again from its
// snapshots, the keys are still spent.
func TestCrashedOwnerReturnsToItsCounters(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		c := startCluster(t, 3)
		crashAndReturn(t, c, false, false)
	})
	t.Run("memory, same address", func(t *testing.T) {
		c := startCluster(t, 3)
		crashAndReturn(t, c, false, true)
	})
	t.Run("snapshot", func(t *testing.T) {
		nodeArgs, _ := snapshotDirs(t)
		c := startClusterWith(t, 3, nodeArgs, "--snapshot-interval", "10s")
		crashAndReturn(t, c, true, false)
		stopAllAtOnce(t, c, syscall.SIGTERM)
		restartAll(c)
		if admitted, s := checkReturned(t, c, c.nodes[1]); admitted != 0 {
			t.Errorf("after a whole-cluster restart from the snapshots, %d of 90 checks of spent keys admitted: %s", admitted, s)
		}
	})
}

// returnKeys are the keys crashAndReturn spends.
const returnKeys = 30

func returnItem(k int, hits int64) *pb.CheckItem {
	return &pb.CheckItem{Name: "return", Key: fmt.Sprint("k", k), Limit: 10, DurationMs: hour, Hits: ptr(hits)}
}

// crashAndReturn spends the keys through nodes 0 and 2, kills node 1
// and starts it again under its name (see
// TestCrashedOwnerReturnsToItsCounters), at its address if inPlace (as a
// container restarted in its pod), else at another (as a pod started
// again elsewhere). With snapshot, node 1 writes a snapshot while the keys
// are half spent, and is killed before its next.
func crashAndReturn(t *testing.T, c *testCluster, snapshot, inPlace bool) {
	victim := c.nodes[1]
	r := ring.New(ring.Member{Name: c.nodes[0].name}, ring.Member{Name: victim.name}, ring.Member{Name: c.nodes[2].name})
	owned := 0
	for k := range returnKeys {
		if o, _ := r.Owner(fmt.Sprint("k", k)); o.Name == victim.name {
			owned++
		}
	}
	if owned == 0 {
		t.Fatalf("%s owns none of the %d keys", victim.name, returnKeys)
	}
	spendAll := func(hits int64) {
		t.Helper()
		for k := range returnKeys {
			via := c.nodes[2*(k%2)]
			if res, err := check(via, returnItem(k, hits)); err != nil || res.Status != pb.Status_UNDER_LIMIT {
				t.Fatalf("spending k%d via %s: %v %v", k, via.name, res, err)
			}
		}
	}
	if snapshot {
		spendAll(5)
		spent := time.Now()
		poll(t, 15*time.Second, victim.name+" writes a snapshot begun after the first half was spent", func() (bool, string) {
			at, err := metric(victim, "ringlimit_snapshot_last_written_timestamp_seconds")
			if err != nil {
				return false, err.Error()
			}
			return at >= float64(spent.UnixNano())/1e9, fmt.Sprintf("last written at %v", at)
		})
		spendAll(5)
	} else {
		spendAll(10)
	}
	replicated(t, victim)

	victim.signal(t, syscall.SIGKILL)
	if !victim.wait(5 * time.Second) {
		t.Fatalf("%s did not exit after SIGKILL", victim.name)
	}
	var back *node
	if inPlace {
		back = c.restartInPlace(1)
	} else {
		back = c.replace(1)
	}
	took := c.waitConverged(3)
	t.Logf("%s (owner of %d of the %d keys) restarted; all three list three members %v later", victim.name, owned, returnKeys, took.Round(time.Millisecond))
	if admitted, s := checkReturned(t, c, back); admitted != 0 {
		t.Errorf("after its owner came back, %d of 90 checks of spent keys admitted: %s", admitted, s)
	}
}

// checkReturned checks each key of crashAndReturn once through each node,
// through first before the others (a check through another node that
// fails over to the key's heir would have the heir take its replica as its
// counter first), and returns how many were admitted, and a summary.
func checkReturned(t *testing.T, c *testCluster, first *node) (int, string) {
	t.Helper()
	tl := &tally{}
	var admitted []string
	via := []*node{first}
	for _, n := range c.nodes {
		if n != first {
			via = append(via, n)
		}
	}
	for k := range returnKeys {
		for _, n := range via {
			res, err := check(n, returnItem(k, 1))
			tl.add(res, err)
			if err == nil && res.Status == pb.Status_UNDER_LIMIT {
				admitted = append(admitted, fmt.Sprintf("k%d via %s (remaining %d)", k, n.name, res.Remaining))
			}
		}
	}
	t.Logf("90 checks of spent keys: %v", tl)
	return tl.admitted, fmt.Sprint(tl, "; admitted: ", admitted)
}
