//go:build chaos

package e2e

import (
	"fmt"
	"testing"
	"time"
)

// TestChaosRollingRestart restarts all five nodes one after the other,
// as a StatefulSet rollout does: each is taken out of the load first (as
// its endpoint leaves the Service), stopped with SIGTERM (it leaves and
// hands off its counters), started again under the same name and put
// back once every node sees all five alive. At least 99.9% of the checks
// are answered, and the checks admitted are within 1% of the exact limit:
// counters move with their keys both ways.
func TestChaosRollingRestart(t *testing.T) {
	c := startChaos(t, 5)
	l := startLoad(t, c.id, c.nodes, 3*time.Minute, "rolling restart of 5")
	time.Sleep(3 * time.Second) // load before the first restart
	var figures []string
	for i, n := range c.nodes {
		others := append(append([]*chaosNode{}, c.nodes[:i]...), c.nodes[i+1:]...)
		l.setTargets(others)
		start := time.Now()
		stopped := c.stop(n)
		if _, err := docker("start", n.container); err != nil {
			fatalf(t, "%v", err)
		}
		c.waitMembers(chaosReady)
		l.setTargets(c.nodes)
		figures = append(figures, fmt.Sprintf("%s: stopped in %v, back and converged %v after the stop",
			n.name, stopped.Round(10*time.Millisecond), time.Since(start).Round(10*time.Millisecond)))
		time.Sleep(2 * time.Second) // load on the whole cluster between restarts
	}
	l.stop()
	l.table(t, "rolling restart of all 5 nodes (SIGTERM, start, wait ready, next)", figures...)
	l.minAnswered(t, 0, 0.999)
	l.within(t, 0.01)
}

// TestChaosScale scales a cluster from 3 nodes to 5 and back to 3 under
// load, as `helm upgrade --set replicaCount` does: no check fails, and the
// checks admitted are within 1% of the exact limit (counters are handed
// to their new owners on the way out and on the way back).
func TestChaosScale(t *testing.T) {
	c := startChaos(t, 3)
	l := startLoad(t, c.id, c.nodes, 2*time.Minute, "3 nodes", "scaling to 5", "scaling back to 3")
	time.Sleep(5 * time.Second) // load on 3
	l.next()
	c.add()
	c.add()
	up := c.waitMembers(chaosReady)
	l.setTargets(c.nodes)
	time.Sleep(5 * time.Second) // load on 5
	l.next()
	l.setTargets(c.nodes[:3])
	start := time.Now()
	for _, n := range c.nodes[3:] {
		c.stop(n)
	}
	down := c.waitMembers(chaosReady) + time.Since(start)
	time.Sleep(5 * time.Second) // load on 3 again
	l.stop()
	l.table(t, "scale 3 -> 5 -> 3",
		fmt.Sprintf("5 nodes converged %v after the two started", up.Round(10*time.Millisecond)),
		fmt.Sprintf("3 nodes converged %v after the two were stopped", down.Round(10*time.Millisecond)))
	for i := range l.phases {
		l.minAnswered(t, i, 1)
	}
	l.within(t, 0.01)
}
