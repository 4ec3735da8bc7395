package service

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/heal"
)

// TestFrozenOwnerIsSuspectedUntilItAnswers freezes an owner: the first
// check for its keys waits the forward deadline, every later one is
// decided here at once with this node's share, for as long as the owner
// stays frozen (well past one suspicion period, confirmed by failed
// probes); once the owner answers a probe, checks are forwarded again.
func TestFrozenOwnerIsSuspectedUntilItAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		c, svcs := newFakeClusterWith(3, func(i int) Config {
			if i == 0 {
				return Config{Registerer: reg}
			}
			return Config{}
		})
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		wg.Go(func() { svcs[0].heal.Run(ctx) })
		defer wg.Wait()
		defer cancel()

		item := &pb.CheckItem{Name: "api", Key: c.keyOwnedBy(2), Limit: 30, DurationMs: 60_000}
		timed := func() (*pb.CheckResult, time.Duration) {
			start := time.Now()
			r := check(t, svcs[0], item)
			return r, time.Since(start)
		}

		c.frozen.Store("peer-2", true)
		r, took := timed()
		if took != fakeForwardDeadline || r.Metadata[MetadataDecidedBy] != routeFailover {
			t.Fatalf("first check of a frozen owner: took %v, metadata %v; want the deadline %v and a failover to the key's heir", took, r.Metadata, fakeForwardDeadline)
		}
		// 40 checks over 4s, four suspicion periods: all answered at once.
		for i := range 40 {
			r, took := timed()
			if took != 0 || r.Metadata[MetadataDecidedBy] != routeFailover {
				t.Fatalf("check %d after the first timeout: took %v, metadata %v; want no wait and a failover", i, took, r.Metadata)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if n := svcs[2].store.Len(); n != 0 {
			t.Fatalf("the frozen owner holds %d counters, want 0", n)
		}
		if n := metricSum(t, reg, "ringlimit_suspect_owners"); n != 1 {
			t.Errorf("ringlimit_suspect_owners = %v while the owner is frozen, want 1", n)
		}
		if n := metricSum(t, reg, "ringlimit_failover_checks_total"); n != 41 {
			t.Errorf("ringlimit_failover_checks_total = %v after 41 failover answers, want 41", n)
		}

		c.frozen.Delete("peer-2")
		time.Sleep(heal.ProbeEvery + heal.ProbeTimeout) // one round of probes, at most, finds it answering
		synctest.Wait()
		r, took = timed()
		if took != 0 || r.Metadata[MetadataDecidedBy] != "" {
			t.Fatalf("check after the owner answered a probe: took %v, metadata %v; want it forwarded", took, r.Metadata)
		}
		if n := svcs[2].store.Len(); n != 1 {
			t.Fatalf("the owner holds %d counters after it answered, want 1", n)
		}
		if n := metricSum(t, reg, "ringlimit_suspect_owners"); n != 0 {
			t.Errorf("ringlimit_suspect_owners = %v after the owner answered, want 0", n)
		}
	})
}

// TestSuspicionReleasesForwardsInFlight: checks already waiting on a
// frozen owner when the first forward to it times out are answered then,
// by failover, rather than each at its own deadline.
func TestSuspicionReleasesForwardsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, svcs := newFakeCluster(2)
		c.frozen.Store("peer-1", true)
		start := time.Now()
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * 500 * time.Millisecond) // sent at 0, 0.5s, 1s and 1.5s
				item := &pb.CheckItem{Name: "api", Key: c.keyOwnedBy(1), Limit: 30, DurationMs: 60_000, Behavior: pb.Behavior_UNBATCHED}
				if i%2 == 1 {
					item.Behavior = pb.Behavior_BATCHED
				}
				r := check(t, svcs[0], item)
				if done := time.Since(start); done != fakeForwardDeadline || r.Metadata[MetadataDecidedBy] != routeFailover {
					t.Errorf("check %d answered %v after the first was sent, metadata %v; want with the first timeout, %v, by failover",
						i, done, r.Metadata, fakeForwardDeadline)
				}
			})
		}
		wg.Wait()
	})
}

// TestSuspicionLapsesWithoutProbes: a service that does not Run sends no
// probes, so its suspicion of an owner ends heal.SuspectFor after the last
// failure, and the next check is forwarded again.
func TestSuspicionLapsesWithoutProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, svcs := newFakeCluster(2)
		item := &pb.CheckItem{Name: "api", Key: c.keyOwnedBy(1), Limit: 30, DurationMs: 60_000}
		c.frozen.Store("peer-1", true)
		check(t, svcs[0], item)
		c.frozen.Delete("peer-1")
		if r := check(t, svcs[0], item); r.Metadata[MetadataDecidedBy] != routeFailover {
			t.Fatalf("check while suspect: metadata %v, want a failover", r.Metadata)
		}
		time.Sleep(heal.SuspectFor)
		if r := check(t, svcs[0], item); r.Metadata[MetadataDecidedBy] != "" {
			t.Fatalf("check after the suspicion lapsed: metadata %v, want it forwarded", r.Metadata)
		}
	})
}
