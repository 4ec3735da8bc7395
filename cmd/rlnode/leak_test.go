package main

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// TestShutdownLeavesNoGoroutines runs a two-node cluster with forwarded,
// batched and GLOBAL traffic, shuts both nodes down, and checks that no
// goroutine a node started outlives its serve call.
func TestShutdownLeavesNoGoroutines(t *testing.T) {
	before := goleak.IgnoreCurrent()
	defer func() {
		// memberlist's Shutdown does not wait for a probe in flight, which
		// ends by itself within two probe intervals (2 s on the LAN
		// preset): poll for up to 10 s rather than expect none at once.
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := goleak.Find(before)
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Error(err)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	c := startCluster(t, 2, "--global-sync", "20ms")
	for _, behavior := range []pb.Behavior{pb.Behavior_BATCHED, pb.Behavior_UNBATCHED, pb.Behavior_GLOBAL} {
		for _, key := range c.keysNotOwnedBy(0, 20) {
			item := &pb.CheckItem{Name: "leak", Key: key, Limit: 10, DurationMs: 60_000, Behavior: behavior}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if _, err := c.clients[0].Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{item}}); err != nil {
				t.Fatal(err)
			}
			cancel()
		}
	}
	for i := len(c.stops) - 1; i >= 0; i-- {
		if err := c.stops[i](); err != nil {
			t.Errorf("node %d: serve returned %v", i, err)
		}
		c.clients[i].Close()
	}
}
