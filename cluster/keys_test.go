package cluster

import (
	"bytes"
	"slices"
	"testing"
)

func key(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

// TestStrangerCannotJoin is the attack of issue 7: a memberlist node that
// does not hold the cluster's gossip key tries to join. It must not get in,
// so it is never given a share of the ring (nor, therefore, counters by
// hand-off or forwarded checks), whether it has no key or a wrong one.
func TestStrangerCannotJoin(t *testing.T) {
	k := [][]byte{key(1)}
	a := startKeyed(t, "a", "", k)
	b := startKeyed(t, "b", "", k, a.GossipAddr()) // the control: the key lets b in
	waitFor(t, hasMembers(a.Cluster, "a", "b"), "a sees b")
	waitFor(t, hasMembers(b.Cluster, "a", "b"), "b sees a")

	for _, tc := range []struct {
		name string
		keys [][]byte
	}{
		{"stranger-without-key", nil},
		{"stranger-with-wrong-key", [][]byte{key(2)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startKeyed(t, tc.name, "", tc.keys, a.GossipAddr(), b.GossipAddr())
			// Let it try several times (it retries every few tens of ms).
			waitFor(t, func() bool { return metric(t, s.reg, "ringlimit_cluster_join_attempts_total") >= 3 }, "three join attempts")
			if s.Ready() {
				t.Error("the stranger reports ready: it joined")
			}
			for _, n := range []*testNode{a, b} {
				if got := ringNames(n.Ring()); !slices.Equal(got, []string{"a", "b"}) {
					t.Errorf("%s's ring = %v, want [a b]: the stranger got a share", n.LocalMember().Name, got)
				}
				if n.Member(tc.name) {
					t.Errorf("%s: Member(%q) = true", n.LocalMember().Name, tc.name)
				}
				for _, m := range n.Members() {
					if m.Name == tc.name {
						t.Errorf("%s lists the stranger as a member (%s)", n.LocalMember().Name, m.State)
					}
				}
			}
			if got := ringNames(s.Ring()); !slices.Equal(got, []string{tc.name}) {
				t.Errorf("the stranger's ring = %v, want only itself", got)
			}
			s.stop()
		})
	}
}

// TestKeyRotation rolls a new gossip key out in the documented steps and
// checks that nodes at neighbouring steps gossip with each other: first
// every node adds the new key second (old, new), then every node makes it
// first (new, old), then drops the old one (new).
func TestKeyRotation(t *testing.T) {
	oldK, newK := key(1), key(2)
	steps := [][][]byte{{oldK}, {oldK, newK}, {newK, oldK}, {newK}}
	for i := range len(steps) - 1 {
		a := startKeyed(t, "a", "", steps[i])
		b := startKeyed(t, "b", "", steps[i+1], a.GossipAddr())
		waitFor(t, hasMembers(a.Cluster, "a", "b"), "step %d: a sees b", i)
		waitFor(t, hasMembers(b.Cluster, "a", "b"), "step %d: b sees a", i)
		b.stop()
		a.stop()
	}
}

// TestMember: members are the nodes gossip knows, alive or gone for less
// than LeftGrace, so that a leaving node's hand-off is taken.
func TestMember(t *testing.T) {
	a := start(t, "a", "")
	b := start(t, "b", "", a.GossipAddr())
	waitFor(t, hasMembers(a.Cluster, "a", "b"), "a sees b")
	for _, name := range []string{"a", "b"} {
		if !a.Member(name) {
			t.Errorf("Member(%q) = false", name)
		}
	}
	if a.Member("ghost") || a.Member("") {
		t.Error("a name gossip never carried is a member")
	}
	b.stop()
	waitFor(t, hasMembers(a.Cluster, "a"), "a sees b leave")
	if !a.Member("b") {
		t.Error("b is not a member right after it left: its hand-off would be refused")
	}
}
