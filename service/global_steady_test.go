package service

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// TestGlobalSteadyHotKeyStaysNearTheLimit drives one GLOBAL key from six
// callers spread over three nodes, well over its limit, for three seconds
// of virtual time with sync rounds every 100ms: the cluster admits no
// more than the limit allows over that time (the bucket's burst plus its
// refill), and no less than 90% of it.
func TestGlobalSteadyHotKeyStaysNearTheLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, svcs := newFakeClusterWith(3, func(int) Config {
			return Config{Now: time.Now, GlobalSync: 100 * time.Millisecond} // virtual time in the bubble
		})
		ctx, cancel := context.WithCancel(context.Background())
		var nodes sync.WaitGroup
		for _, s := range svcs {
			nodes.Go(func() { s.Run(ctx) })
		}
		const limit, period, run = 50, time.Second, 3 * time.Second
		item := &pb.CheckItem{Name: "steady", Key: c.keyOwnedBy(1), Limit: limit, DurationMs: period.Milliseconds(), Behavior: pb.Behavior_GLOBAL}
		req := &pb.CheckRequest{Requests: []*pb.CheckItem{item}}
		var admitted atomic.Int64
		var callers sync.WaitGroup
		stop := time.Now().Add(run)
		for w := range 6 {
			callers.Go(func() {
				for time.Now().Before(stop) {
					resp, err := svcs[w%3].Check(ctx, req)
					if err != nil || resp.Responses[0].Error != "" {
						t.Errorf("check: %v %v", resp, err)
						return
					}
					if resp.Responses[0].Status == pb.Status_UNDER_LIMIT {
						admitted.Add(1)
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
		callers.Wait()
		cancel()
		nodes.Wait()
		allowed := int64(limit + limit*run/period)
		t.Logf("GLOBAL admitted %d of the %d the limit allows in %v", admitted.Load(), allowed, run)
		if got := admitted.Load(); got > allowed || got < allowed*9/10 {
			t.Errorf("GLOBAL admitted %d in %v, want at most %d and at least 90%% of it", got, run, allowed)
		}
	})
}
