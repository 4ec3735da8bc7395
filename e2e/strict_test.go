package e2e

import (
	"fmt"
	"strings"
	"sync"
	"syscall"
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
	_, send, admitted, phases := strictLoad("strict", keys, limit)
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

// TestStrictGracefulLeave runs three rlnode processes in strict mode
// (--strict-quorum 2, a fence of 20 s, longer than the test) and stops one
// with SIGTERM, as a rolling update does, under load through the other
// two. The stopped node hands its counters over and says it left, so
// once it has exited its keys are answered by their new owners at once
// (no refusal from escrow, as the fence would give) and stay exact: each
// key admits its limit, no more (nothing admitted twice) and no less (not
// counted spent).
func TestStrictGracefulLeave(t *testing.T) {
	c := startCluster(t, 3, "--strict-quorum", "2", "--strict-fence", "20s")
	victim, survivors := c.nodes[2], c.nodes[:2]
	const keys, limit = 30, 20
	item, send, admitted, phases := strictLoad("leave", keys, limit)
	for i := range keys * 12 { // 12 of 20 spent on each key
		send(0, survivors[i%2], i)
	}

	victim.signal(t, syscall.SIGTERM)
	stopped := time.Now()
	for i := 0; i < 2000 && !victim.exited() && time.Since(stopped) < shutdownTimeout+5*time.Second; i++ {
		send(1, survivors[i%2], i%keys)  // few: the first keys get at most their limit
		time.Sleep(5 * time.Millisecond) // pacing the load, not waiting for an effect
	}
	if !victim.wait(shutdownTimeout + 5*time.Second) {
		t.Fatalf("%s did not exit within %v of SIGTERM", victim.name, shutdownTimeout+5*time.Second)
	}
	exited := victim.exitedAt.Sub(stopped)
	c.waitConverged(2)
	for i := range keys * 15 {
		send(2, survivors[i%2], i)
	}

	for p, name := range []string{"before", "while it left", "after it exited"} {
		t.Logf("%s: %v", name, phases[p])
	}
	t.Logf("%s exited %v after SIGTERM; its strict mode lines:\n%s", victim.name, exited.Round(time.Millisecond), linesWith(victim.out.String(), "strict mode"))
	for i := range keys {
		if key := item(i).Key; admitted[key] != limit {
			t.Errorf("%s admitted %d, want exactly its limit of %d", key, admitted[key], limit)
		}
	}
	if n := phases[2].decidedBy["escrow"]; n != 0 {
		t.Errorf("after %s exited, %d checks refused from escrow: its keys were fenced", victim.name, n)
	}
	for p := range phases {
		if phases[p].errors != 0 {
			t.Errorf("phase %d: %d checks failed: %v", p, phases[p].errors, phases[p])
		}
	}
}

// linesWith returns the lines of out that contain s.
func linesWith(out, s string) string {
	var keep []string
	for line := range strings.Lines(out) {
		if strings.Contains(line, s) {
			keep = append(keep, strings.TrimSpace(line))
		}
	}
	return strings.Join(keep, "\n")
}

// strictLoad is the load of the strict tests, in three phases: item(i) is
// a check of key <prefix>:<i mod keys>, limit an hour; send(p, n, i) sends
// it to n in phase p and counts the answer in phases[p] and, if admitted,
// in admitted by key (read them once the senders are done).
func strictLoad(prefix string, keys, limit int) (item func(int) *pb.CheckItem, send func(p int, n *node, i int), admitted map[string]int, phases []*tally) {
	item = func(i int) *pb.CheckItem {
		return &pb.CheckItem{Name: "strict", Key: fmt.Sprint(prefix, ":", i%keys), Limit: int64(limit), DurationMs: hour, Algorithm: pb.Algorithm_SLIDING_LOG}
	}
	var mu sync.Mutex
	admitted = map[string]int{}
	phases = []*tally{{}, {}, {}}
	send = func(p int, n *node, i int) {
		r, err := check(n, item(i))
		phases[p].add(r, err)
		if err == nil && r.Status == pb.Status_UNDER_LIMIT {
			mu.Lock()
			admitted[item(i).Key]++
			mu.Unlock()
		}
	}
	return item, send, admitted, phases
}
