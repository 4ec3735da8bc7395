package cluster

import (
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// TestJoiningOnlySelfIsNotReady: a node whose Join reaches only itself
// (the first pod behind a headless Service, without Bootstrap) is not a
// cluster of one by mistake: it is not ready, says why, and keeps trying;
// once another node answers, it is. Before, it was ready at once.
func TestJoiningOnlySelfIsNotReady(t *testing.T) {
	addr := freePort(t)
	a := start(t, "a", addr, addr)
	waitFor(t, func() bool { return metric(t, a.reg, "ringlimit_cluster_join_attempts_total") >= 3 }, "a keeps trying")
	ready, why := a.Readiness()
	if a.Ready() || ready {
		t.Fatalf("a, whose --join reaches only itself, is ready (%v, %q)", a.Ready(), why)
	}
	for _, want := range []string{"not ready: not joined: only this node answered", addr, "--bootstrap"} {
		if !strings.Contains(why, want) {
			t.Errorf("Readiness says %q, want it to contain %q", why, want)
		}
	}
	start(t, "b", "", addr)
	waitFor(t, a.Ready, "a ready once b answers")
	if ready, why := a.Readiness(); !ready || why != "" {
		t.Errorf("a joined: Readiness = %v, %q; want ready, nothing to say", ready, why)
	}
}

// TestJoinTargetDownIsNotReadyAndSaysWhy: a node whose Join addresses
// answer no one is not ready and says so, naming them, with or without
// Bootstrap naming another node; Bootstrap makes the node itself ready
// alone once its first join has failed.
func TestJoinTargetDownIsNotReadyAndSaysWhy(t *testing.T) {
	down := freePort(t)
	b := start(t, "b", "", down)
	waitFor(t, func() bool { return metric(t, b.reg, "ringlimit_cluster_join_attempts_total") >= 2 }, "b retries")
	ready, why := b.Readiness()
	if ready || !strings.Contains(why, "not joined: no node answered") || !strings.Contains(why, down) || !strings.Contains(why, "trying again in") ||
		strings.ContainsAny(why, "\n\t") {
		t.Errorf("b, whose join target is down: Readiness = %v, %q; want not ready, saying in one line that no node answered %s and when it tries again", ready, why, down)
	}

	first := startWith(t, "first", "", func(c *Config) { c.Bootstrap = true }, down)
	waitFor(t, first.Ready, "the bootstrap node ready alone")
	if ready, why := first.Readiness(); !ready {
		t.Errorf("bootstrap node: Readiness = %v, %q; want ready", ready, why)
	}
}

// TestReconnectFindsAMemberGossipForgot: a member declared dead, and
// forgotten by memberlist (no gossip to the dead), that comes back at its
// address without joining anyone is found again by the others'
// reconnect, and is back in their rings. Before, nothing ever dialled it
// again: two clusters stayed apart.
func TestReconnectFindsAMemberGossipForgot(t *testing.T) {
	// Probes every 200ms: memberlist's Shutdown leaves a probe in flight
	// for up to a ProbeInterval, which goleak would report at the end.
	quick := func(c *Config) {
		c.Memberlist = memberlist.DefaultLocalConfig()
		c.Memberlist.ProbeInterval, c.Memberlist.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond
	}
	forget := func(c *Config) {
		quick(c)
		c.ReconnectInterval = 50 * time.Millisecond
		c.Memberlist.GossipToTheDeadTime = time.Nanosecond // forgotten at once
	}
	a := startWith(t, "a", "", forget)
	mAddr := freePort(t)
	crashed, _ := crashable(t, "m", mAddr, a.GossipAddr())
	waitFor(t, hasMembers(a.Cluster, "a", "m"), "a sees m; has %v", ringNames(a.Ring()))
	crashed.Shutdown() // a crash: no leave
	waitFor(t, hasMembers(a.Cluster, "a"), "a drops m; has %v", ringNames(a.Ring()))

	m := startWith(t, "m", mAddr, quick) // no Join: only a's reconnect can find it
	waitFor(t, hasMembers(a.Cluster, "a", "m"), "a finds m again; has %v", ringNames(a.Ring()))
	waitFor(t, hasMembers(m.Cluster, "a", "m"), "m sees a; has %v", ringNames(m.Ring()))
}

// crashable is a bare memberlist node called name, bound to bind, that
// joins join and gossips ringlimit metadata from the delegate it returns:
// one that can crash (Shutdown without Leave) or change its metadata,
// which a Cluster cannot.
func crashable(t *testing.T, name, bind string, join string) (*memberlist.Memberlist, *delegate) {
	t.Helper()
	host, port, err := splitHostPort(bind)
	if err != nil {
		t.Fatal(err)
	}
	d := &delegate{}
	m, err := encodeMeta(meta{Peer: "127.0.0.1:1", Boot: "crashed-process"})
	if err != nil {
		t.Fatal(err)
	}
	d.meta.Store(&m)
	mc := memberlist.DefaultLocalConfig()
	mc.Name, mc.BindAddr, mc.BindPort, mc.AdvertisePort = name, host, port, port
	mc.ProbeInterval, mc.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond
	mc.Delegate = d
	mc.LogOutput = logWriter{log: slog.New(slog.DiscardHandler)}
	ml, err := memberlist.Create(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ml.Shutdown() })
	if _, err := ml.Join([]string{join}); err != nil {
		t.Fatal(err)
	}
	return ml, d
}

// TestAReturningProcessKnowsItReturns: a process that joins under a name
// the cluster knew from an earlier process (crashed, or left gracefully,
// as in a rolling update) learns it at its join, with the members the
// join found alive, which may hold its keys' counters (see package
// handoff); a process under a new name does not. Before, nothing told a
// returning process it was one, and it decided its keys on fresh counters
// when its first ring lacked one of their heirs.
func TestAReturningProcessKnowsItReturns(t *testing.T) {
	a := start(t, "a", "")
	b := start(t, "b", "", a.GossipAddr())
	waitFor(t, hasMembers(a.Cluster, "a", "b"), "a sees b")
	if got := b.Returning(); got != nil {
		t.Errorf("b, a new name: Returning = %v, want nil", got)
	}

	crashed, _ := crashable(t, "c", freePort(t), a.GossipAddr())
	waitFor(t, hasMembers(b.Cluster, "a", "b", "c"), "b sees c; has %v", ringNames(b.Ring()))
	crashed.Shutdown() // a crash: no leave
	c := start(t, "c", "", a.GossipAddr())
	waitFor(t, c.Ready, "the returning c joins")
	if got, want := c.Returning(), []string{"a", "b"}; !slices.Equal(got, want) {
		t.Errorf("c, back after a crash: Returning = %v, want %v", got, want)
	}

	c.stop() // a graceful leave, as in a rolling update
	again := start(t, "c", "", b.GossipAddr())
	waitFor(t, again.Ready, "c joins again after leaving")
	if got, want := again.Returning(), []string{"a", "b"}; !slices.Equal(got, want) {
		t.Errorf("c, back after a graceful leave: Returning = %v, want %v", got, want)
	}
}
