//go:build chaos

package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestChaosKillNine kills one of five nodes with SIGKILL under load: the
// survivors answer at least 99% of the checks sent to them while the ring
// drops it, the ring converges within 10 s, and every check after that is
// answered.
func TestChaosKillNine(t *testing.T) { chaosKillNine(t) }

// chaosKillNine runs the scenario of TestChaosKillNine on nodes with the flags
// args, and returns its load.
func chaosKillNine(t *testing.T, args ...string) *chaosLoad {
	c := startChaos(t, 5, args...)
	victim, survivors := c.nodes[4], c.nodes[:4]
	l := startLoad(t, c.id, c.nodes, 30*time.Second, "before", "during (kill -9 until converged)", "after")
	time.Sleep(5 * time.Second) // load before the event
	l.setTargets(survivors)     // as a Service drops the endpoint
	l.next()
	if _, err := docker("kill", "--signal", "KILL", victim.container); err != nil {
		fatalf(t, "%v", err)
	}
	converged := c.waitMembers(10 * time.Second)
	l.next()
	time.Sleep(8 * time.Second) // load after the event
	l.stop()
	l.table(t, "kill -9 one of 5 nodes", fmt.Sprintf("ring converged %v after the kill (bound 10s)", converged.Round(10*time.Millisecond)))
	l.minAnswered(t, 1, 0.99)
	l.minAnswered(t, 2, 1)
	return l
}

// TestChaosStopAll stops all five nodes at once, as `helm uninstall`
// does: each leaves and hands off as far as it can, and every one exits 0
// within 8 s, not one leave timeout per node.
func TestChaosStopAll(t *testing.T) {
	c := startChaos(t, 5)
	l := startLoad(t, c.id, c.nodes, time.Minute, "load before the stop")
	time.Sleep(5 * time.Second) // load, so that there are counters to hand off
	l.stop()
	start := time.Now()
	var wg sync.WaitGroup
	took := make([]time.Duration, len(c.nodes))
	for i, n := range c.nodes {
		wg.Go(func() {
			docker("stop", "--time", fmt.Sprint(int(chaosGrace.Seconds())+15), n.container)
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	var rows []string
	for i, n := range c.nodes {
		code, err := docker("inspect", "--format", "{{.State.ExitCode}}", n.container)
		rows = append(rows, fmt.Sprintf("| %s | %v | %s |", n.name, took[i].Round(10*time.Millisecond), code))
		if err != nil || code != "0" {
			errorf(t, "%s: exit code %q (%v), want 0", n.name, code, err)
		}
		if took[i] > 8*time.Second {
			errorf(t, "%s: exited %v after the stop, want within 8s", n.name, took[i])
		}
	}
	l.table(t, "all 5 nodes stopped at once (docker stop, SIGTERM)",
		"\n| node | exited after | exit code |\n|---|---|---|\n"+strings.Join(rows, "\n"))
}

// fallbackSlack is what a check whose owner does not answer may take
// beyond forwardDeadline (freeze_test.go): the local decision with this
// node's share and the client's own round trip.
const fallbackSlack = 250 * time.Millisecond

// TestChaosPause freezes one of five nodes (docker pause: SIGSTOP to its
// processes, as a long GC pause or a stalled VM) for 15 s under load sent
// to the other four: no check waits longer than the forward deadline,
// and once thawed the node rejoins, every node sees all five alive within
// 15 s, and every check after that is answered.
func TestChaosPause(t *testing.T) { chaosPause(t) }

// chaosPause runs the scenario of TestChaosPause on nodes with the flags
// args, and returns its load.
func chaosPause(t *testing.T, args ...string) *chaosLoad {
	c := startChaos(t, 5, args...)
	frozen, others := c.nodes[4], c.nodes[:4]
	l := startLoad(t, c.id, others, time.Minute, "before", "frozen for 15s", "after the thaw")
	_, rejoined := c.fault(l, 15*time.Second, func() {
		if _, err := docker("pause", frozen.container); err != nil {
			fatalf(t, "%v", err)
		}
	}, func() {
		if _, err := docker("unpause", frozen.container); err != nil {
			fatalf(t, "%v", err)
		}
	})
	l.table(t, "docker pause one of 5 nodes for 15s", fmt.Sprintf("all 5 alive again %v after the thaw (bound 15s)", rejoined.Round(10*time.Millisecond)))
	if slowest := time.Duration(l.phases[1].slowest.Load()); slowest > forwardDeadline+fallbackSlack {
		errorf(t, "slowest check while %s was frozen took %v, want at most the forward deadline %v (+%v)", frozen.name, slowest, forwardDeadline, fallbackSlack)
	}
	l.minAnswered(t, 2, 1)
	return l
}

// TestChaosPartition cuts two of five nodes off the network between the
// nodes for 20 s (docker network disconnect) under load sent to all five,
// then heals the network: every side keeps answering (each decides with
// the ring it sees). Each cut-off node reaches no other node, so the
// cluster is split in three sides, and a key's owner is on one of them:
// no key admits more than its limit once for each side (the owner's, and
// once more for each side without it). Every node sees all five alive
// within 15 s of the heal, and from then on no check is decided without
// its owner; and each key's counter then counts what every side admitted
// (sumProbe).
func TestChaosPartition(t *testing.T) { chaosPartition(t) }

// chaosPartition runs the scenario of TestChaosPartition on nodes with the flags
// args, and returns its load.
func chaosPartition(t *testing.T, args ...string) *chaosLoad {
	c := startChaos(t, 5, args...)
	minority := c.nodes[3:]
	l := startLoad(t, c.id, c.nodes, 2*time.Minute, "before", "partitioned 3/1/1 for 20s", "after the heal, until converged", "converged")
	probe := &sumProbe{id: c.id}
	healedAt, healed := c.fault(l, 20*time.Second, func() {
		for _, n := range minority {
			c.cut(n)
		}
		probe.during(append([]*chaosNode{c.nodes[0]}, minority...))
	}, func() {
		for _, n := range minority {
			c.heal(n)
		}
	})
	sides := 1 + len(minority) // the majority, and each node cut off alone
	most := l.perSide(t, sides)
	drained := l.ownerlessAfter(t, healedAt, 2, 3)
	exact, admitted := probe.verify(t, c.nodes[0])
	l.table(t, "partition 2 of 5 nodes for 20s, then heal",
		fmt.Sprintf("all 5 alive and none suspect on every node %v after the heal (bound 15s)", healed.Round(10*time.Millisecond)),
		fmt.Sprintf("the most a key admitted: %d, for a limit of %d on each of %d sides (bound %d)", most, chaosLimit, sides, sides*chaosLimit),
		fmt.Sprintf("last check decided without its owner %v after the heal (bound: none once converged)", drained.Round(10*time.Millisecond)),
		fmt.Sprintf("%d keys checked on all %d sides below their limit (%d admitted in all): after the heal, %d count exactly every side's admissions (bound: none fewer)",
			sumKeys, sides, admitted, exact))
	for i := range l.phases {
		l.minAnswered(t, i, 0.99)
	}
	return l
}
