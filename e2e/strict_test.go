package e2e

import (
	"fmt"
	"sync"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// TestStrictFrozenOwner runs three rlnode processes in strict mode
// (--strict-quorum 2, a fence of 4 s) and stops one with SIGSTOP for 12 s,
// longer than memberlist takes to drop it and the fence after that, under
// load through the other two; then thaws it and checks every key through
// all three. No key admits more than its limit at any point: the frozen
// node's keys are refused (decided_by escrow) while it is unreachable, its
// heirs take them over only after the fence and count them spent, and
// after the thaw the hand-off keeps the more charged counters. The test
// logs what strict mode cost in refusals.
func TestStrictFrozenOwner(t *testing.T) {
	c := startCluster(t, 3, "--strict-quorum", "2", "--strict-fence", "4s")
	victim, survivors := c.nodes[2], c.nodes[:2]
	const keys, limit = 30, 20
	item := func(i int) *pb.CheckItem {
		return &pb.CheckItem{Name: "strict", Key: fmt.Sprint("strict:", i%keys), Limit: limit, DurationMs: hour, Algorithm: pb.Algorithm_SLIDING_LOG}
	}
	var mu sync.Mutex
	admitted := map[string]int{}
	phases := []*tally{{}, {}, {}}
	send := func(p int, n *node, i int) {
		r, err := check(n, item(i))
		phases[p].add(r, err)
		if err == nil && r.Status == pb.Status_UNDER_LIMIT {
			mu.Lock()
			admitted[item(i).Key]++
			mu.Unlock()
		}
	}
	for i := range keys * 12 { // 12 of 20 spent on each key
		send(0, survivors[i%2], i)
	}

	thaw := victim.freeze(t)
	stopped := time.Now()
	var wg sync.WaitGroup
	for w, n := range survivors {
		wg.Go(func() {
			for i := w; i < 4000 && time.Since(stopped) < 12*time.Second; i += 2 {
				send(1, n, i)
				time.Sleep(5 * time.Millisecond) // pacing the load, not waiting for an effect
			}
		})
	}
	wg.Wait()
	thaw()
	c.waitConverged(3)
	for i := range keys * 15 {
		send(2, c.nodes[i%3], i)
	}

	over := 0
	for key, n := range admitted {
		if n > limit {
			over += n - limit
			t.Errorf("%s admitted %d, over its limit of %d", key, n, limit)
		}
	}
	for p, name := range []string{"before", "frozen for 12s", "after the thaw"} {
		t.Logf("%s: %v", name, phases[p])
	}
	t.Logf("over the limit: %d", over)
	if phases[1].decidedBy["escrow"] == 0 || phases[1].decidedBy["failover"]+phases[1].decidedBy["fallback"] != 0 {
		t.Errorf("while frozen, answers by decided_by %v; want refusals from escrow and no failover or fallback", phases[1].decidedBy)
	}
	for p := range phases {
		if phases[p].errors != 0 {
			t.Errorf("phase %d: %d checks failed: %v", p, phases[p].errors, phases[p])
		}
	}
}
