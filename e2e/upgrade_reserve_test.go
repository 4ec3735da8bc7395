package e2e

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/ring"
)

// TestUpgradeRefusesReservationsCleanly: a node of the previous version
// that comes to own a key whose counter holds reservations refuses the
// counter, a record of a version it does not read (UNKNOWN_VERSION), and
// keeps running; the counters without reservations in the same hand-off
// move to it as before. The sender counts the refusal and keeps the
// counter, reservations and all (meanwhile the old node decides the key
// without it, and a settle is refused UNAVAILABLE); once the old node has been replaced by
// this version, the counter moves to it and its reservations are settled
// there exactly once (docs/reservations.md, "Reservations travel with
// their counter").
//
// Nodes e2e-0 and e2e-1 are of this version; e2e-2, of the previous
// version, joins once the reservations are made, and the key is one the
// ring of all three gives to e2e-2 and the ring of e2e-0 and e2e-1 to
// e2e-0, the sender.
func TestUpgradeRefusesReservationsCleanly(t *testing.T) {
	prev := previousRlnode(t)
	c := &testCluster{t: t, bins: map[string]string{"e2e-2": prev}}
	c.startAll(2)
	sender, other := c.nodes[0], c.nodes[1]
	key := keyMovingTo(t, "e2e-2", sender.name, other.name)
	open, first := reservations(t, other, key)
	spend(t, other)

	old := c.add()
	c.waitConverged(3)
	poll(t, keepTimeout, sender.name+" counts the counter with reservations refused by the previous version", func() (bool, string) {
		v, err := metric(sender, "ringlimit_handoff_refused_total", `direction="sent"`, `reason="unknown_version"`)
		return err == nil && v >= 1, fmt.Sprintf("refused %v, %v", v, err)
	})
	// The counters without reservations moved to the old node in that
	// round: all of them keep their state, read through the old node too.
	pollKept(t, "with a node of the previous version", old, sender)

	if old.exited() {
		t.Fatalf("%s, of the previous version, exited after refusing the counter: %v", old.name, old.waitErr)
	}
	if v, err := metric(old, "ringlimit_handoff_refused_total", `direction="received"`, `reason="unknown_version"`); err != nil || v < 1 {
		t.Errorf("%s refused %v counters as of an unknown version (%v), want at least the one with reservations", old.name, v, err)
	}
	if v, err := metric(old, "ringlimit_handoff_refused_total", `direction="received"`, `reason="invalid"`); err != nil || v != 0 {
		t.Errorf("%s refused %v counters as invalid (%v), want none: a newer record is of an unknown version, not invalid", old.name, v, err)
	}
	if out := old.out.String(); !strings.Contains(out, "counter record version 3") {
		t.Errorf("%s's log does not name the record version it refused:\n%s", old.name, out)
	}
	if v, err := metric(sender, "ringlimit_handoff_pending_counters"); err != nil || v < 1 {
		t.Errorf("%s holds %v counters for other owners (%v), want at least the refused one", sender.name, v, err)
	}
	if v, err := metric(sender, "ringlimit_reservations"); err != nil || v != 2 {
		t.Errorf("%s holds %v reservations (%v), want the 2 made: the refused counter kept them", sender.name, v, err)
	}

	// Meanwhile the old node decides the key's checks without the kept
	// counter, and a settle of its reservations through a node of this
	// version is refused UNAVAILABLE, to be sent again, charging nothing
	// (settledOnce below finds the open reservation unsettled).
	for _, n := range []*node{sender, other} {
		if r, err := check(n, reserveItem(key, 0)); err != nil || r.Remaining != reserveLimit {
			t.Errorf("the key through %s while %s owns it: %v, %v; want %d remaining, decided without the kept counter", n.name, old.name, r, err, reserveLimit)
		}
		if r, err := settle(t, n, open, key, 10); status.Code(err) != codes.Unavailable {
			t.Errorf("settle through %s while %s owns the key: %v, %v; want UNAVAILABLE", n.name, old.name, r, err)
		}
	}

	// The upgrade ends: the old node leaves, and comes back as this
	// version, which takes the counter, and its reservations with it.
	stop(t, old)
	c.waitConverged(2)
	delete(c.bins, old.name)
	c.replace(2)
	c.waitConverged(3)
	settledOnce(t, other, key, open, first)
	pollKept(t, "once every node is of this version", c.nodes...)
}

// keyMovingTo returns a key that the ring of members and joiner gives to
// joiner, and the ring of members alone to members[0].
func keyMovingTo(t *testing.T, joiner string, members ...string) string {
	t.Helper()
	var before []ring.Member
	for _, m := range members {
		before = append(before, ring.Member{Name: m})
	}
	r, after := ring.New(before...), ring.New(append(before, ring.Member{Name: joiner})...)
	for i := range 10_000 {
		key := fmt.Sprint("tenant:", i)
		o, _ := r.Owner(key)
		n, _ := after.Owner(key)
		if o.Name == members[0] && n.Name == joiner {
			return key
		}
	}
	t.Fatalf("no key moving from %s to %s", members[0], joiner)
	return ""
}
