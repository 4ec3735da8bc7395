package cluster

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/ring"
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

// TestAJoinWaitsForItsFirstAdmissions: a node with Config.Admit that joins
// is ready, and publishes a ring other than itself alone, only once the
// first check of every member its join brought has ended: members
// admitted one check at a time would otherwise give it rings of some of
// them, in which it takes keys it holds in the whole ring for ones it
// held already (see finishJoin). A member that fails its check holds
// nothing.
func TestAJoinWaitsForItsFirstAdmissions(t *testing.T) {
	a := start(t, "a", "")
	for _, name := range []string{"b", "c", "d"} {
		start(t, name, "", a.GossipAddr())
	}
	waitFor(t, func() bool { return a.Ring().Len() == 4 }, "a sees 4; has %v", ringNames(a.Ring()))

	release := make(chan struct{})
	var mu sync.Mutex
	checked := map[string]bool{}
	var sizes []int
	admit := func(ctx context.Context, name, _ string) error {
		mu.Lock()
		checked[name] = true
		mu.Unlock()
		switch name {
		case "b":
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		case "d":
			return errors.New("certificate names someone else")
		}
		return nil
	}
	z := startWith(t, "z", "", func(c *Config) {
		c.Admit = admit
		c.OnChange = func(_, r *ring.Ring) {
			mu.Lock()
			defer mu.Unlock()
			sizes = append(sizes, r.Len())
		}
	}, a.GossipAddr())
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(checked) == 4 && metric(t, z.reg, "ringlimit_cluster_admission_failures_total") >= 1
	}, "z checks a, b, c and d, and d fails")
	if z.Ready() || z.Ring().Len() != 1 {
		t.Fatalf("with b's check in flight: ready %v, ring %v; want not ready, z alone", z.Ready(), ringNames(z.Ring()))
	}
	close(release)
	waitFor(t, z.Ready, "z ready once b's check ends")
	if got, want := ringNames(z.Ring()), []string{"a", "b", "c", "z"}; !slices.Equal(got, want) {
		t.Fatalf("z's ring when ready: %v, want %v", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, n := range sizes {
		if n != 1 && n != 4 {
			t.Fatalf("z published rings of %v members, want only itself and all 4 admitted", sizes)
		}
	}
}

// TestANodeWithAdmissionIsNotReadyBeforeItJoins: admission's verdicts and
// its retry tick end a joined node's wait for its first checks, and must
// not make ready a node whose join has not succeeded: before, the first
// tick made a node that could reach no one ready (and a verdict that came
// in while the join was in flight made one ready with a ring of some
// members: TestAJoinWaitsForItsFirstAdmissions failed so in CI).
func TestANodeWithAdmissionIsNotReadyBeforeItJoins(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nobody := l.Addr().String()
	l.Close() // no one listens there now
	z := startWith(t, "z", "", func(c *Config) {
		c.Admit = func(context.Context, string, string) error { return nil }
	}, nobody)
	end := time.Now().Add(3 * admitRetry) // bounded: three of admission's ticks
	for time.Now().Before(end) {
		if z.Ready() {
			t.Fatal("a node whose join reaches no one is ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
