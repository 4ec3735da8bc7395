package cluster

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// TestDuplicateNameRefused is the attack of a node started under the name
// of a live member: it refuses to serve (Run fails with ErrNameTaken, it is
// never Ready), owns no keys in the others' rings, and the member holding
// the name is not marked dead when it stops.
func TestDuplicateNameRefused(t *testing.T) {
	a := start(t, "n1", "")
	c := start(t, "n2", "", a.GossipAddr())
	waitFor(t, hasMembers(c.Cluster, "n1", "n2"), "n2 sees n1")
	aAddr := a.GossipAddr()

	dup, err := New(Config{
		NodeName: "n1", BindAddr: "127.0.0.1:0", Join: []string{c.GossipAddr()},
		PeerAddr: "127.0.0.1:1", JoinRetry: 20 * time.Millisecond,
		Memberlist: memberlist.DefaultLocalConfig(), Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- dup.Run(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrNameTaken) || !strings.Contains(err.Error(), aAddr) {
			t.Errorf("Run of a second n1 = %v, want ErrNameTaken naming %s", err, aAddr)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("a second n1 kept running")
	}
	if dup.Ready() {
		t.Error("the second n1 reports ready")
	}

	// Another node joins after the impostor stopped; by the time it sees
	// the cluster, a leave in n1's name would have been heard.
	d := start(t, "n3", "", c.GossipAddr())
	waitFor(t, hasMembers(c.Cluster, "n1", "n2", "n3"), "n2 sees n3")
	waitFor(t, hasMembers(d.Cluster, "n1", "n2", "n3"), "n3 sees all")
	waitFor(t, hasMembers(a.Cluster, "n1", "n2", "n3"), "n1 sees all")
	for _, n := range []*testNode{a, c, d} {
		for _, m := range n.Members() {
			if m.Name == "n1" && (m.State != Alive || m.GossipAddr != aAddr) {
				t.Errorf("%s sees n1 as %+v, want alive at %s", n.LocalMember().Name, m, aAddr)
			}
		}
	}
}

// TestRestartUnderOwnName checks that the name check lets a crashed node
// come back under its name at another address: its old entry does not
// answer a ping, so the new run waits for it to be declared dead.
func TestRestartUnderOwnName(t *testing.T) {
	c := start(t, "n2", "")
	mc := memberlist.DefaultLocalConfig()
	mc.Name, mc.BindAddr, mc.BindPort = "n1", "127.0.0.1", 0
	mc.LogOutput = logWriter{log: slog.New(slog.DiscardHandler)}
	crashed, err := memberlist.Create(mc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crashed.Join([]string{c.GossipAddr()}); err != nil {
		t.Fatal(err)
	}
	oldAddr := crashed.LocalNode().Address()
	waitFor(t, func() bool { return len(c.Members()) == 2 }, "n2 sees the first n1")
	crashed.Shutdown() // a crash: no leave

	n1 := start(t, "n1", "", c.GossipAddr())
	waitFor(t, n1.Ready, "the restarted n1 is ready")
	waitFor(t, func() bool {
		for _, m := range c.Members() {
			if m.Name == "n1" {
				return m.State == Alive && m.GossipAddr == n1.GossipAddr() && m.GossipAddr != oldAddr
			}
		}
		return false
	}, "n2 sees n1 alive at its new address")
}
