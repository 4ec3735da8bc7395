package service

import (
	"fmt"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/strict"
)

// leaveGracefully takes node i out of c as its shutdown does (package
// node's leave): it routes by the ring without itself and runs a round of
// hand-off, while the member at the peer address unreachable, if any,
// cannot be reached; then the rings of the others and its own drop it (it
// leaves gossip), its peer port closes, and it says it has left.
func leaveGracefully(t *testing.T, c *fakeCluster, svcs []*Service, i int, unreachable string) (told, fenced int) {
	t.Helper()
	s := svcs[i]
	s.Leave()
	if unreachable != "" {
		c.down[unreachable] = true
	}
	s.HandOff(t.Context())
	delete(c.down, unreachable)
	without := c.ring.Without(fmt.Sprint("node-", i))
	var all []int
	for k := range svcs {
		all = append(all, k)
	}
	setRings(c, svcs, all, without)
	c.down[fmt.Sprint("peer-", i)] = true
	return s.SayLeft(t.Context())
}

// strictHourly is a check of key, limit 10 an hour.
func strictHourly(key string) *pb.CheckItem {
	return &pb.CheckItem{Name: "api", Key: key, Limit: 10, DurationMs: 3_600_000, Algorithm: pb.Algorithm_SLIDING_LOG}
}

// TestStrictGracefulLeaveIsNotFenced: in strict mode, the keys of a member
// that leaves gracefully, hands its counters over and says so are decided
// by their new owner at once, on the counter handed over, neither refused
// for the fence nor counted spent after it; and no key admits more than
// its limit: the counter holds what the member admitted (its replica,
// never sent, holds none of it).
func TestStrictGracefulLeaveIsNotFenced(t *testing.T) {
	clk, c, svcs := strictThree()
	key := c.keyInheritedBy(2, 1)
	admitted := 0
	for range 8 {
		if check(t, svcs[0], strictHourly(key)).Status == pb.Status_UNDER_LIMIT {
			admitted++
		}
	}
	if told, fenced := leaveGracefully(t, c, svcs, 2, ""); told != 2 || fenced != 0 {
		t.Fatalf("node-2 told %d members it left, %d not; want 2, 0", told, fenced)
	}
	for _, after := range []time.Duration{0, strict.DefaultFence + time.Second} {
		clk.add(after)
		for n := range 4 {
			r := check(t, svcs[n%2], strictHourly(key))
			if by := r.Metadata[MetadataDecidedBy]; by != "" {
				t.Errorf("%v after the leave, via node-%d: decided by %q; want the new owner, at once", after, n%2, by)
			}
			if r.Status == pb.Status_UNDER_LIMIT {
				admitted++
			}
		}
		if after == 0 && admitted != 10 {
			t.Errorf("at once after the leave: %d admitted in all, want 10 (8 before, the 2 left after)", admitted)
		}
	}
	if admitted != 10 {
		t.Errorf("%d admitted in all, want the limit, 10", admitted)
	}
}

// TestStrictLeaveWithUnfinishedHandOffStaysFenced: a member that leaves
// with counters it could not hand over (their new owner could not be
// reached) says it left only to the members it handed everything to: the
// keys of those are decided at once, and the others' are refused for the
// fence and then counted spent, as a crash's.
func TestStrictLeaveWithUnfinishedHandOffStaysFenced(t *testing.T) {
	clk, c, svcs := strictThree()
	kept, handed := c.keyInheritedBy(2, 1), c.keyInheritedBy(2, 0)
	for range 8 {
		check(t, svcs[0], strictHourly(kept))
		check(t, svcs[1], strictHourly(handed))
	}
	if told, fenced := leaveGracefully(t, c, svcs, 2, "peer-1"); told != 1 || fenced != 1 {
		t.Fatalf("node-2 told %d members it left, %d not; want 1 (node-0), 1 (node-1, whose counter it holds)", told, fenced)
	}
	steps := []struct {
		name     string
		after    time.Duration
		key      string
		by       string
		admitted int
	}{
		{"handed over: decided at once", 0, handed, "", 2},
		{"kept: fenced", 0, kept, "escrow", 0},
		{"kept: fenced until the fence ends", strict.DefaultFence - time.Millisecond, kept, "escrow", 0},
		{"kept: counted spent after the fence", time.Millisecond, kept, "", 0},
	}
	for _, st := range steps {
		clk.add(st.after)
		admitted := 0
		for n := range 4 {
			r := check(t, svcs[n%2], strictHourly(st.key))
			if by := r.Metadata[MetadataDecidedBy]; by != st.by {
				t.Errorf("%s, via node-%d: decided by %q, want %q", st.name, n%2, by, st.by)
			}
			if r.Status == pb.Status_UNDER_LIMIT {
				admitted++
			}
		}
		if admitted != st.admitted {
			t.Errorf("%s: %d admitted, want %d", st.name, admitted, st.admitted)
		}
	}
}

// TestStrictSayLeftAfterARingChange: a member whose ring changed while it
// left (its counters may have gone to a member that holds them still)
// tells no one it left: its keys stay fenced.
func TestStrictSayLeftAfterARingChange(t *testing.T) {
	_, c, svcs := strictThree()
	svcs[2].Leave()
	c.views.Store("node-2", c.ring.Without("node-0")) // node-0 drops out and comes back while node-2 leaves
	svcs[2].HandOff(t.Context())
	c.views.Store("node-2", c.ring)
	if told, fenced := leaveGracefully(t, c, svcs, 2, ""); told != 0 || fenced != 2 {
		t.Errorf("node-2 told %d members it left, %d not; want 0, 2", told, fenced)
	}
}

// TestStrictGracefulLeaveStillFencesGlobalAndCeilings: after a graceful
// leave whose word was taken, the new owner still fences the member's
// keys' GLOBAL checks and checks with a ceiling (a leaving node may decide
// those on a counter it has handed over), while plain checks of the same
// keys are decided at once.
func TestStrictGracefulLeaveStillFencesGlobalAndCeilings(t *testing.T) {
	_, c, svcs := strictThree()
	key := c.keyInheritedBy(2, 1)
	check(t, svcs[0], strictHourly(key))
	if told, _ := leaveGracefully(t, c, svcs, 2, ""); told != 2 {
		t.Fatalf("node-2 told %d members it left, want 2", told)
	}
	for _, tc := range []struct {
		name string
		item *pb.CheckItem
		by   string
	}{
		{"plain", strictHourly(key), ""},
		{"GLOBAL", strictGlobal(key), "escrow"},
		{"with a ceiling", borrower(pb.Algorithm_SLIDING_LOG, key, 10, 20, 100, time.Hour, 0), "escrow"},
	} {
		if r := check(t, svcs[1], tc.item); r.Metadata[MetadataDecidedBy] != tc.by {
			t.Errorf("%s check of node-2's key after its word: decided by %q, want %q", tc.name, r.Metadata[MetadataDecidedBy], tc.by)
		}
	}
}
