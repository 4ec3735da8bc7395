package cluster

import (
	"fmt"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/ring"
)

// gossiped is a node as memberlist reports it to the delegates.
func gossiped(name string, port uint16) *memberlist.Node {
	m, _ := encodeMeta(meta{Peer: fmt.Sprintf("127.0.0.1:%d", port)})
	return &memberlist.Node{Name: name, Addr: net.IPv4(127, 0, 0, 1), Port: port, Meta: m, State: memberlist.StateAlive}
}

// watched returns a cluster of node "n", not run, that appends each ring
// it publishes to rings.
func watched(t *testing.T, rings *[]*ring.Ring) *Cluster {
	t.Helper()
	c, err := New(Config{NodeName: "n", BindAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:1",
		Memberlist: memberlist.DefaultLocalConfig(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	c.conf.OnChange = func(_, r *ring.Ring) { *rings = append(*rings, r) }
	return c
}

// TestAMergeHoldsTheRingUntilItIsWhole: a join's state names every node
// the other side knows (NotifyMerge); memberlist then reports them one at
// a time, and a rebuild between two reports publishes no ring of some of
// them: the ring changes once, with all of them. Nodes the state gives as
// suspect or dead hold nothing, and a node that never comes (memberlist
// refused it) holds the ring no longer than mergeHold, or until this
// node's join returns.
func TestAMergeHoldsTheRingUntilItIsWhole(t *testing.T) {
	var rings []*ring.Ring
	c := watched(t, &rings)
	ctx := t.Context()
	self := gossiped("n", 1)
	c.events.NotifyJoin(self)
	c.rebuild(ctx)
	rings = nil

	state := []*memberlist.Node{self}
	for i := range 5 {
		state = append(state, gossiped(fmt.Sprintf("m%d", i), uint16(100+i)))
	}
	suspect := gossiped("s", 200)
	suspect.State = memberlist.StateSuspect
	state = append(state, suspect)
	if err := c.events.NotifyMerge(state); err != nil {
		t.Fatalf("NotifyMerge refused the merge: %v", err)
	}
	for _, m := range state[1:5] {
		c.events.NotifyJoin(m)
		c.rebuild(ctx)
		if len(rings) != 0 {
			t.Fatalf("a rebuild during the merge published a ring of %v", ringNames(rings[0]))
		}
	}
	c.events.NotifyJoin(state[5])
	c.rebuild(ctx)
	if want := []string{"m0", "m1", "m2", "m3", "m4", "n"}; len(rings) != 1 || !slices.Equal(ringNames(rings[0]), want) {
		t.Fatalf("rings published once the merge was whole: %d, the last %v; want one, of %v", len(rings), ringNames(c.Ring()), want)
	}

	// A node the state names that memberlist never reports.
	rings = nil
	if err := c.events.NotifyMerge([]*memberlist.Node{gossiped("refused", 300), gossiped("x", 301)}); err != nil {
		t.Fatal(err)
	}
	c.events.NotifyJoin(gossiped("x", 301))
	c.rebuild(ctx)
	if len(rings) != 0 {
		t.Fatalf("a ring of %v published while the merge was still held", ringNames(rings[0]))
	}
	c.events.mu.Lock()
	c.events.mergeAt = time.Now().Add(-mergeHold) // as if mergeHold had passed
	c.events.mu.Unlock()
	c.rebuild(ctx)
	if len(rings) != 1 || !slices.Contains(ringNames(rings[0]), "x") {
		t.Fatalf("after mergeHold: %d rings published, want one with x", len(rings))
	}

	// This node's own join returns: what its merge brought is all in.
	rings = nil
	if err := c.events.NotifyMerge([]*memberlist.Node{gossiped("refused", 300), gossiped("y", 302)}); err != nil {
		t.Fatal(err)
	}
	c.events.NotifyJoin(gossiped("y", 302))
	c.rebuild(ctx)
	c.events.merged()
	c.rebuild(ctx)
	if len(rings) != 1 || !slices.Contains(ringNames(rings[0]), "y") {
		t.Fatalf("after the join returned: %d rings published, want one with y", len(rings))
	}

	// A state listing more nodes than maxMergeNames holds nothing.
	big := make([]*memberlist.Node, maxMergeNames+1)
	for i := range big {
		big[i] = gossiped(fmt.Sprintf("b%d", i), 400)
	}
	if err := c.events.NotifyMerge(big); err != nil {
		t.Fatal(err)
	}
	if _, merging := c.events.snapshot(time.Now(), keepGone); merging {
		t.Fatal("a state of more than maxMergeNames nodes holds the ring")
	}
}

// TestADeathTakenBackWithinTheGraceMovesNoKeys: a member gossip declares
// dead stays in the ring for FailGrace, so that one that refutes it (a
// heal's stale suspicion) moves no key; one still dead after FailGrace
// leaves the ring then; one never in the ring is not brought into it by
// being declared dead; and a node leaving (rebuild with no ctx) keeps
// none.
func TestADeathTakenBackWithinTheGraceMovesNoKeys(t *testing.T) {
	var rings []*ring.Ring
	c := watched(t, &rings)
	ctx := t.Context()
	for i, name := range []string{"n", "a", "b"} {
		c.events.NotifyJoin(gossiped(name, uint16(1+i)))
	}
	c.rebuild(ctx)
	rings = nil

	c.events.NotifyLeave(gossiped("a", 2))
	c.rebuild(ctx)
	c.events.NotifyJoin(gossiped("a", 2)) // it refuted its death
	c.rebuild(ctx)
	if len(rings) != 0 || !c.Ring().Has("a") {
		t.Fatalf("declared dead and alive again within FailGrace: %d rings published, the ring %v; want none, a kept", len(rings), ringNames(c.Ring()))
	}
	if !c.Member("a") {
		t.Fatal("a is no member after its refutation")
	}

	c.events.NotifyLeave(gossiped("b", 3))
	c.rebuild(ctx)
	if len(rings) != 0 {
		t.Fatalf("a ring of %v published as b was declared dead, before FailGrace", ringNames(rings[0]))
	}
	if infos := c.Members(); !slices.ContainsFunc(infos, func(m MemberInfo) bool { return m.Name == "b" && m.State == Dead }) {
		t.Errorf("members %v: want b reported dead during its grace", infos)
	}
	c.events.mu.Lock()
	b := c.events.nodes["b"]
	b.change = time.Now().Add(-FailGrace) // as if FailGrace had passed
	c.events.nodes["b"] = b
	c.events.mu.Unlock()
	c.rebuild(ctx)
	if want := []string{"a", "n"}; len(rings) != 1 || !slices.Equal(ringNames(rings[0]), want) {
		t.Fatalf("after FailGrace: %d rings, the ring %v; want one, of %v", len(rings), ringNames(c.Ring()), want)
	}

	rings = nil
	c.events.NotifyLeave(gossiped("stranger", 4)) // known only as dead
	c.rebuild(ctx)
	if len(rings) != 0 || c.Ring().Has("stranger") {
		t.Fatalf("a node never in the ring, declared dead, made the ring %v", ringNames(c.Ring()))
	}

	c.events.NotifyLeave(gossiped("a", 2))
	c.rebuild(nil) // this node leaving: its last ring is without it, and keeps no one in grace
	if c.Ring().Has("a") {
		t.Fatalf("leaving, the ring %v keeps a member declared dead", ringNames(c.Ring()))
	}
}
