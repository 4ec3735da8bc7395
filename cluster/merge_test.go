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

// TestAMergeHoldsTheRingUntilItIsWhole: a join's state names every node
// the other side knows (NotifyMerge); memberlist then reports them one at
// a time, and a rebuild between two reports publishes no ring of some of
// them: the ring changes once, with all of them. Nodes the state gives as
// suspect or dead hold nothing, and a node that never comes (memberlist
// refused it) holds the ring no longer than mergeHold, or until this
// node's join returns.
func TestAMergeHoldsTheRingUntilItIsWhole(t *testing.T) {
	c, err := New(Config{NodeName: "n", BindAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:1",
		Memberlist: memberlist.DefaultLocalConfig(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var rings []*ring.Ring
	c.conf.OnChange = func(_, r *ring.Ring) { rings = append(rings, r) }
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
