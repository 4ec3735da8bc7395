package service

import (
	"fmt"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
)

// TestPeerAttackForcedHits: the forced hits of a GLOBAL report (the
// guaranteed hits of a parent) are charged whatever the sender's grant,
// but never more than the counter holds, never twice for a report sent
// again, and impossible counts are rejected and charge nothing. So a
// member can take a parent's room from the borrowers, as it could by
// forwarding checks, and never a key's guarantee.
func TestPeerAttackForcedHits(t *testing.T) {
	c, svcs, reg := newFakeClusterMetered(3, 0)
	client := servePeer(t, svcs[0], nil)
	parentKey := c.keyOwnedBy(0)
	parent := &pb.CheckItem{Name: "api", Key: parentKey, Limit: 10, DurationMs: 3_600_000, Behavior: pb.Behavior_GLOBAL}
	send := func(reports ...*peerpb.GlobalReport) {
		t.Helper()
		if _, err := client.AddGlobalHits(t.Context(), &peerpb.GlobalHitsRequest{From: "node-1", Reports: reports}); err != nil {
			t.Fatal(err)
		}
	}
	send(
		&peerpb.GlobalReport{Item: parent, Forced: -1, Epoch: 1},
		&peerpb.GlobalReport{Item: parent, Forced: 5, ForcedAcked: 6, Epoch: 1},
		&peerpb.GlobalReport{Item: parent, Forced: 5, ForcedAcked: -1, Epoch: 1},
	)
	if got := metricSum(t, reg, "ringlimit_peer_rejected_total", "kind", "global_report", "reason", "invalid"); got != 3 || svcs[0].store.Len() != 0 {
		t.Fatalf("impossible forced counts: %v rejected, %d counters; want 3 rejected, none made", got, svcs[0].store.Len())
	}
	send(&peerpb.GlobalReport{Item: parent, Forced: 4, Epoch: 1})
	send(&peerpb.GlobalReport{Item: parent, Forced: 4, Epoch: 1}) // the same report again
	if got := remaining(svcs[0], parent); got != 6 {
		t.Errorf("after 4 forced hits, reported twice, the parent has %d left, want 6", got)
	}
	send(&peerpb.GlobalReport{Item: parent, Forced: 1_000_000_000, ForcedAcked: 4, Epoch: 1})
	if got := remaining(svcs[0], parent); got != 0 {
		t.Errorf("after a billion forced hits the parent has %d left, want 0", got)
	}
	// The parent is drained (and owes its capacity): a key that names it
	// still has its guarantee, and borrows nothing.
	var key string // another key of node-0's: the parent's counter is the name's and parentKey's
	for k := 0; key == ""; k++ {
		if o, _ := c.ring.Owner(fmt.Sprint("user-", k)); o.Name == "node-0" {
			key = fmt.Sprint("user-", k)
		}
	}
	item := borrower(pb.Algorithm_TOKEN_BUCKET, key, 2, 4, 10, time.Hour, 0)
	item.Parent.Key = parentKey
	for i, want := range []pb.Status{pb.Status_UNDER_LIMIT, pb.Status_UNDER_LIMIT, pb.Status_OVER_LIMIT} {
		if r := check(t, svcs[0], item); r.Status != want || r.Borrowed {
			t.Errorf("check %d of a key whose parent was drained: %v, want %v, not borrowed", i, r, want)
		}
	}
}

// TestBorrowParentUnreachable: when the parent's owner cannot be reached,
// a check is admitted within its guarantee, and refused beyond it at once
// (no borrowing); its guaranteed hits wait in the node's account for the
// parent, and reach the parent once its owner answers again.
func TestBorrowParentUnreachable(t *testing.T) {
	c, svcs, reg := newFakeClusterMetered(3, 0)
	parentKey := c.keyOwnedBy(2)
	item := borrower(pb.Algorithm_FIXED_WINDOW, c.keyOwnedBy(0), 2, 4, 10, time.Hour, 0)
	item.Parent.Key = parentKey
	c.down["peer-2"] = true
	for i, want := range []pb.Status{pb.Status_UNDER_LIMIT, pb.Status_UNDER_LIMIT, pb.Status_OVER_LIMIT} {
		if r := check(t, svcs[0], item); r.Status != want || r.Borrowed || r.Metadata[MetadataDecidedBy] != "" {
			t.Errorf("check %d with the parent's owner down: %v, want %v by the key's owner, not borrowed", i, r, want)
		}
	}
	if got := metricSum(t, reg, "ringlimit_borrow_checks_total", "outcome", "parent_unreachable"); got != 1 {
		t.Errorf("ringlimit_borrow_checks_total{outcome=parent_unreachable} = %v, want 1", got)
	}
	syncRound(svcs) // the report fails: the forced hits stay
	c.down["peer-2"] = false
	syncRound(svcs)
	parent := &pb.CheckItem{Name: "api", Key: parentKey, Limit: 10, DurationMs: 3_600_000, Algorithm: pb.Algorithm_FIXED_WINDOW}
	if got := remaining(svcs[2], parent); got != 8 {
		t.Errorf("the parent has %d left once its owner answers, want 8: the 2 guaranteed hits reached it", got)
	}
	if r := check(t, svcs[0], item); r.Status != pb.Status_UNDER_LIMIT || !r.Borrowed {
		t.Errorf("with the parent's owner back: %v, want borrowed", r)
	}
}

// TestBorrowFallback: a node that cannot reach a key's owner nor its heir
// decides the check with its share of the limit, and borrows nothing.
func TestBorrowFallback(t *testing.T) {
	c, svcs := newFakeCluster(3)
	c.down["peer-2"], c.down["peer-1"] = true, true
	item := borrower(pb.Algorithm_FIXED_WINDOW, c.keyInheritedBy(2, 1), 6, 30, 100, time.Hour, 0)
	admitted := 0
	for range 10 {
		r := check(t, svcs[0], item)
		if r.Metadata[MetadataDecidedBy] != routeFallback.String() || r.Borrowed {
			t.Fatalf("with the owner and heir down: %v, want decided by fallback, not borrowed", r)
		}
		if r.Status == pb.Status_UNDER_LIMIT {
			admitted++
		}
	}
	if admitted != 2 {
		t.Errorf("admitted %d with the owner down, want node 0's share of the limit, 6/3 = 2", admitted)
	}
}

// TestBorrowFailover: the owner replicates a key's ceiling counter with
// its own; with the owner unreachable the key's heir decides on both, so
// a key at its ceiling stays there.
func TestBorrowFailover(t *testing.T) {
	c, svcs := newFakeCluster(3)
	key := c.keyInheritedBy(2, 1)
	item := borrower(pb.Algorithm_FIXED_WINDOW, key, 2, 4, 100, time.Hour, 0)
	item.Parent.Key = c.keyOwnedBy(0)
	for i := range 4 {
		if r := check(t, svcs[0], item); r.Status != pb.Status_UNDER_LIMIT || r.Borrowed != (i >= 2) {
			t.Fatalf("check %d: %v; want admitted, borrowed from the third", i, r)
		}
	}
	if sent := svcs[2].custody.Replicate(t.Context()); sent != 2 {
		t.Fatalf("node-2 replicated %d counters, want the key's own and its ceiling counter", sent)
	}
	c.down["peer-2"] = true
	r := check(t, svcs[0], item)
	if r.Metadata[MetadataDecidedBy] != routeFailover || r.Status != pb.Status_OVER_LIMIT {
		t.Errorf("the owner down: %v; want refused by the heir: the key is at its ceiling on the replica", r)
	}
	ceiling := limiter.Request{Name: "api", Key: key, Algorithm: limiter.FixedWindow, Role: limiter.RoleCeiling}
	if !svcs[1].store.Holds(&ceiling) {
		t.Error("the heir did not promote the ceiling counter")
	}
}

// TestBorrowCountersHandedOff: when a key changes owner, its ceiling
// counter goes with its own to the new owner, which goes on where they
// were.
func TestBorrowCountersHandedOff(t *testing.T) {
	c, svcs := newFakeCluster(3)
	without := c.ring.Without("node-2")
	key := c.keyInheritedBy(2, 1)
	item := borrower(pb.Algorithm_SLIDING_WINDOW, key, 2, 4, 100, time.Hour, 0)
	item.Parent.Key = c.keyOwnedBy(0)
	for range 4 {
		check(t, svcs[2], item)
	}
	c.ring = without
	svcs[2].HandOffAll(t.Context())
	if n := svcs[1].store.Len(); n != 2 {
		t.Fatalf("the new owner holds %d counters, want the key's own and its ceiling", n)
	}
	if r := check(t, svcs[1], item); r.Status != pb.Status_OVER_LIMIT {
		t.Errorf("at the new owner: %v; want refused, at its ceiling", r)
	}
}
