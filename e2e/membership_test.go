package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMemberRestartedAMinuteAfterDeathIsBack: a node killed with SIGKILL,
// declared dead by the others and, a minute later, long forgotten by
// their gossip (memberlist stops gossiping to the dead after 30s, then
// drops them), is started again at its address without --join, as the
// README's first node was restarted with its own command. The others'
// reconnect (--reconnect-interval, 10s by default) finds it, and it is
// back in every ring. Before, it stayed a cluster of one beside the
// other two (over 40s in a newcomer's run; indefinitely here).
func TestMemberRestartedAMinuteAfterDeathIsBack(t *testing.T) {
	c := startCluster(t, 3)
	victim := c.nodes[2]
	victim.signal(t, syscall.SIGKILL)
	victim.wait(5 * time.Second)
	c.waitConverged(2)
	dead := time.Now()

	// The minute it stays away: the others keep it out meanwhile.
	for time.Since(dead) < time.Minute {
		for _, n := range c.nodes[:2] {
			if ms, err := members(n); err == nil && slices.Contains(aliveNames(ms), victim.name) {
				t.Fatalf("%s lists %s alive while it is dead: %+v", n.name, victim.name, ms)
			}
		}
		time.Sleep(time.Second) // polling through the minute the scenario waits
	}

	back := &node{name: victim.name, http: victim.http, grpc: victim.grpc, peer: victim.peer, gossip: victim.gossip}
	if victim.client != nil {
		victim.client.Close()
	}
	if err := c.exec(back); err != nil { // no --join
		t.Fatalf("restarting %s: %v\n%s", back.name, err, back.out)
	}
	c.nodes[2] = back
	took := c.waitConverged(3)
	t.Logf("%s, restarted %v after it was declared dead, is back in every ring %v after its start", back.name,
		time.Since(dead).Round(time.Second), took.Round(time.Millisecond))
	for _, n := range c.nodes {
		ms, err := members(n)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.Share <= 0 {
				t.Errorf("%s: %s has no share of the ring: %+v", n.name, m.Name, ms)
			}
		}
	}
}

// TestJoinTargetDownIsNotReadyE2E: an rlnode process whose --join
// answers no one is not ready, and GET /readyz says why, naming the
// address; once a node answers there, it is ready.
func TestJoinTargetDownIsNotReadyE2E(t *testing.T) {
	c := startCluster(t, 1)
	ports := freePorts(t, 4)
	down := loopback(ports[3])
	n := &node{name: "e2e-late", http: loopback(ports[0]), grpc: loopback(ports[1]), peer: loopback(ports[2]), gossip: loopback(freePorts(t, 1)[0])}
	if err := c.exec(n, "--join", down); err != nil {
		t.Fatalf("starting %s: %v\n%s", n.name, err, n.out)
	}
	c.nodes = append(c.nodes, n)
	poll(t, convergeTimeout, "e2e-late says it is not joined", func() (bool, string) {
		code, body, err := httpGet(n.http + "/readyz")
		return err == nil && code == http.StatusServiceUnavailable && strings.Contains(string(body), "not joined: no node answered") &&
			strings.Contains(string(body), down), fmt.Sprintf("%d %s %v", code, body, err)
	})
	// The address starts answering: a node of the cluster there.
	seed := &node{name: "e2e-seed", http: loopback(freePorts(t, 1)[0]), grpc: loopback(freePorts(t, 1)[0]), peer: loopback(freePorts(t, 1)[0]), gossip: down}
	if err := c.exec(seed, "--join", c.nodes[0].gossip); err != nil {
		t.Fatalf("starting %s: %v\n%s", seed.name, err, seed.out)
	}
	c.nodes = append(c.nodes, seed)
	c.waitConverged(3)
}
