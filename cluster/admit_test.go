package cluster

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// TestAdmission: a member gossip announces enters the ring of a node with
// Config.Admit only once Admit accepts it, on that node; until then it is
// no Member, is counted unadmitted, and each failed check is counted and
// tried again, with the peer address gossip announced.
func TestAdmission(t *testing.T) {
	var mu sync.Mutex
	accept := false
	var checked []string
	admit := func(_ context.Context, name, addr string) error {
		mu.Lock()
		defer mu.Unlock()
		checked = append(checked, name+" "+addr)
		if !accept {
			return errors.New("certificate names someone else")
		}
		return nil
	}
	a := startWith(t, "a", "", func(c *Config) { c.Admit = admit })
	b := start(t, "b", "", a.GossipAddr())
	waitFor(t, func() bool { return b.Ring().Len() == 2 }, "b admits a (b checks nothing)")
	waitFor(t, func() bool { return metric(t, a.reg, "ringlimit_cluster_admission_failures_total") >= 2 }, "a checks b twice")
	if a.Ring().Len() != 1 || a.Member("b") || !a.Member("a") {
		t.Fatalf("before b is admitted: a's ring holds %d, Member(b) = %v, Member(a) = %v; want 1, false, true", a.Ring().Len(), a.Member("b"), a.Member("a"))
	}
	if got := metric(t, a.reg, "ringlimit_cluster_members_unadmitted"); got != 1 {
		t.Errorf("unadmitted = %v, want 1", got)
	}
	mu.Lock()
	if want := "b 127.0.0.1:" + portFor("b", 8082); checked[0] != want {
		t.Errorf("a checked %q, want %q", checked[0], want)
	}
	accept = true
	mu.Unlock()
	waitFor(t, func() bool { return a.Ring().Len() == 2 }, "a admits b once the check passes")
	if !a.Member("b") || metric(t, a.reg, "ringlimit_cluster_members_unadmitted") != 0 {
		t.Errorf("after admission: Member(b) = %v, unadmitted = %v", a.Member("b"), metric(t, a.reg, "ringlimit_cluster_members_unadmitted"))
	}
}
