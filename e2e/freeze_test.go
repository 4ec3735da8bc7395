package e2e

import (
	"fmt"
	"sync"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// forwardDeadline is rlnode's forward deadline (peer.Config.Timeout's
// default).
const forwardDeadline = 2 * time.Second

// freezeLoad is what one survivor's checks met while the owner was frozen.
type freezeLoad struct {
	checks, fallbacks int
	slowest           time.Duration // of every check
	slowestAfter      time.Duration // of the checks sent after the first fallback answer
	fallbackKeys      []string
	err               error
}

// TestFrozenOwner stops one of three nodes with SIGSTOP (what docker pause
// does) while each survivor checks keys of every owner, one check at a
// time: for 3s, less than memberlist takes to declare it dead, and for 7s,
// more. A check for the frozen node's keys waits at most the forward
// deadline, once per survivor: after that first timeout the survivor
// suspects the owner and answers its keys at once with its share
// (decided_by fallback), and later as their owner once the ring drops the
// frozen node. After SIGCONT the node is a member again and checks are
// forwarded to it again.
func TestFrozenOwner(t *testing.T) {
	for _, frozenFor := range []time.Duration{3 * time.Second, 7 * time.Second} {
		t.Run(frozenFor.String(), func(t *testing.T) { testFrozenOwner(t, frozenFor) })
	}
}

func testFrozenOwner(t *testing.T, frozenFor time.Duration) {
	c := startCluster(t, 3)
	victim, survivors := c.nodes[2], c.nodes[:2]
	item := func(i int) *pb.CheckItem {
		return &pb.CheckItem{Name: "freeze", Key: fmt.Sprint("freeze:", i%30), Limit: 100_000, DurationMs: hour}
	}
	// Warm the connections to the victim, so that the checks below meet a
	// frozen peer rather than a first dial.
	for i := range 60 {
		if _, err := check(survivors[i%2], item(i)); err != nil {
			t.Fatalf("before the freeze: %v", err)
		}
	}

	thaw := victim.freeze(t)
	stopped := time.Now()
	loads := make([]freezeLoad, len(survivors))
	var wg sync.WaitGroup
	for w, n := range survivors {
		wg.Go(func() {
			l := &loads[w]
			seen := map[string]bool{}
			for i := 0; i < 1000 && time.Since(stopped) < frozenFor; i++ {
				start := time.Now()
				r, err := check(n, item(i))
				took := time.Since(start)
				if err != nil {
					l.err = err
					return
				}
				l.checks++
				l.slowest = max(l.slowest, took)
				if l.fallbacks > 0 {
					l.slowestAfter = max(l.slowestAfter, took)
				}
				if r.Metadata["decided_by"] != "" { // failover to the key's heir, or a share: not the owner
					l.fallbacks++
					if key := item(i).Key; !seen[key] {
						seen[key] = true
						l.fallbackKeys = append(l.fallbackKeys, key)
					}
				}
				time.Sleep(10 * time.Millisecond) // pacing the load, not waiting for an effect
			}
		})
	}
	wg.Wait()
	thaw()

	for w, l := range loads {
		n := survivors[w]
		t.Logf("%s while %s was frozen: %d checks, %d not by their owner (failover or fallback) on %d keys, slowest %v, slowest after the first %v",
			n.name, victim.name, l.checks, l.fallbacks, len(l.fallbackKeys), l.slowest.Round(time.Millisecond), l.slowestAfter.Round(time.Millisecond))
		if l.err != nil {
			t.Errorf("%s: a check failed while the owner was frozen: %v", n.name, l.err)
			continue
		}
		if l.fallbacks == 0 {
			t.Errorf("%s: every check was decided by its owner; want the frozen owner's keys decided elsewhere", n.name)
			continue
		}
		// 500ms of slack for a loaded machine's scheduling, not for waiting.
		if l.slowest > forwardDeadline+500*time.Millisecond {
			t.Errorf("%s: a check took %v, want at most the forward deadline %v", n.name, l.slowest, forwardDeadline)
		}
		// Generous: these are answered without a network round trip.
		if l.slowestAfter > forwardDeadline/2 {
			t.Errorf("%s: after the first timeout a check still took %v; want the suspect owner's keys answered at once", n.name, l.slowestAfter)
		}
	}
	if t.Failed() {
		return
	}

	took := c.waitConverged(3)
	t.Logf("%s is an alive member of all 3 again %v after SIGCONT", victim.name, took.Round(time.Millisecond))
	// Once the thawed node answers a probe, its keys are forwarded to it
	// again: no more fallback answers for them.
	took = poll(t, 10*time.Second, "checks for the thawed node's keys are forwarded again", func() (bool, string) {
		for w, n := range survivors {
			for _, key := range loads[w].fallbackKeys {
				r, err := check(n, &pb.CheckItem{Name: "freeze", Key: key, Limit: 100_000, DurationMs: hour})
				if err != nil {
					return false, err.Error()
				}
				if by := r.Metadata["decided_by"]; by != "" {
					return false, fmt.Sprintf("%s: %s decided_by %q", n.name, key, by)
				}
			}
		}
		return true, ""
	})
	t.Logf("forwarding to %s resumed within %v of convergence", victim.name, took.Round(time.Millisecond))
	if _, err := check(victim, item(0)); err != nil {
		t.Errorf("the thawed node does not answer: %v", err)
	}
}
