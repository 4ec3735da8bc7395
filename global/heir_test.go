package global

import (
	"fmt"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/ring"
)

var t0 = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

func newShard() *shard {
	return &shard{heirs: map[key]*heirLease{}, book: &book{keys: map[Lessee]int{}}}
}

// TestKeepGrants: an heir keeps, of an owner's broadcast, the accounts of
// members that lent hits not yet reported used, and forgets what it kept
// when a broadcast lends nothing.
func TestKeepGrants(t *testing.T) {
	r := ring.New(ring.Member{Name: "a"}, ring.Member{Name: "b"}, ring.Member{Name: "c"})
	sh, k := newShard(), key{"api", "user:1"}
	st := &peerpb.GlobalState{Grants: []*peerpb.GlobalGrant{
		{Node: "a", Granted: 10, Received: 4, Epoch: 7}, // kept: 6 lent
		{Node: "b", Granted: 5, Received: 5, Epoch: 1},  // nothing lent
		{Node: "c", Granted: 9, Epoch: 2},               // the owner's own
		{Node: "mallory", Granted: 100, Epoch: 1},       // not a member
	}}
	if err := sh.keepGrants(k, "c", st, r, t0); err != nil {
		t.Fatal(err)
	}
	h := sh.heirs[k]
	if len(h.accounts) != 1 || h.accounts["a"] != (nodeLease{granted: 10, received: 4, epoch: 7}) {
		t.Fatalf("kept %+v, want only a's account", h.accounts)
	}
	if got := h.outstanding(100, t0); got != 6 {
		t.Errorf("outstanding %d, want 6", got)
	}
	if got := h.outstanding(5, t0); got != 5 {
		t.Errorf("outstanding under a capacity of 5: %d, want 5", got)
	}
	if got := h.outstanding(100, t0.Add(heirLeaseTTL+time.Nanosecond)); got != 0 {
		t.Errorf("outstanding after the TTL: %d, want 0", got)
	}
	if err := sh.keepGrants(k, "c", &peerpb.GlobalState{Grants: []*peerpb.GlobalGrant{{Node: "a", Granted: 10, Received: 10, Epoch: 7}}}, r, t0); err != nil {
		t.Fatal(err)
	}
	if _, ok := sh.heirs[k]; ok {
		t.Error("a broadcast that lends nothing left the kept grants in place")
	}
}

// TestKeepGrantsBounded: however many keys owners broadcast, an heir keeps
// grants for at most maxHeirLeasesPerShard of them a shard, stale ones
// forgotten first.
func TestKeepGrantsBounded(t *testing.T) {
	r := ring.New(ring.Member{Name: "a"}, ring.Member{Name: "c"})
	sh := newShard()
	st := &peerpb.GlobalState{Grants: []*peerpb.GlobalGrant{{Node: "a", Granted: 1, Epoch: 1}}}
	old := key{"api", "old"}
	if err := sh.keepGrants(old, "c", st, r, t0); err != nil {
		t.Fatal(err)
	}
	later := t0.Add(heirLeaseTTL + time.Second)
	for i := range 2 * maxHeirLeasesPerShard {
		if err := sh.keepGrants(key{"api", fmt.Sprint("k", i)}, "c", st, r, later); err != nil {
			t.Fatal(err)
		}
		if len(sh.heirs) > maxHeirLeasesPerShard {
			t.Fatalf("%d kept after %d broadcasts, want at most %d", len(sh.heirs), i+1, maxHeirLeasesPerShard)
		}
		if i == maxHeirLeasesPerShard-1 {
			if _, ok := sh.heirs[old]; ok {
				t.Error("a full shard kept a stale lease and forgot a fresh one")
			}
		}
	}
}

// TestStartFrom: a new owner's lease starts from the kept accounts, trimmed
// to the counter's capacity in node name order, and from none once they
// are stale.
func TestStartFrom(t *testing.T) {
	h := &heirLease{owner: "c", at: t0, accounts: map[string]nodeLease{
		"b": {granted: 20, received: 10, epoch: 2},
		"a": {granted: 8, received: 2, epoch: 1},
	}}
	l := &lease{nodes: map[string]*nodeLease{}}
	l.startFrom(h, 12, time.Second, t0)
	if got := l.outstanding(); got != 12 {
		t.Errorf("outstanding %d, want the capacity 12", got)
	}
	if a, b := *l.nodes["a"], *l.nodes["b"]; a != (nodeLease{granted: 8, received: 2, epoch: 1}) || b != (nodeLease{granted: 16, received: 10, epoch: 2}) {
		t.Errorf("accounts a %+v, b %+v; want a whole, b trimmed to 6 lent", a, b)
	}
	stale := &lease{nodes: map[string]*nodeLease{}}
	stale.startFrom(h, 100, time.Second, t0.Add(heirLeaseTTL+time.Second))
	if len(stale.nodes) != 0 {
		t.Errorf("a stale lease started from %d accounts", len(stale.nodes))
	}
}
