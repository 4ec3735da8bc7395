package main

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/latency"
)

// keysNotOwnedBy returns n keys whose owner is not node i, so that checks
// sent to node i are all forwarded.
func (c *testCluster) keysNotOwnedBy(i, n int) []string {
	r := c.nodes[i].Cluster().Ring()
	self := c.nodes[i].Cluster().LocalMember().Name
	var keys []string
	for k := 0; len(keys) < n; k++ {
		key := fmt.Sprint("bench:", k)
		if o, _ := r.Owner(key); o.Name != self {
			keys = append(keys, key)
		}
	}
	return keys
}

// benchChecks runs b.N requests of items checks each, keys taken in turn
// from keys, through node 0 from clients concurrent clients (a multiple of
// GOMAXPROCS). Latencies are per request.
func benchChecks(b *testing.B, c *testCluster, behavior pb.Behavior, keys []string, items, clients int) {
	var lat latency.Recorder
	b.SetParallelism(max(1, clients/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	start := time.Now()
	b.RunParallel(func(p *testing.PB) {
		var mine []time.Duration
		i := 0
		for p.Next() {
			req := &pb.CheckRequest{Requests: make([]*pb.CheckItem, items)}
			for k := range req.Requests {
				i++
				req.Requests[k] = &pb.CheckItem{Name: "bench", Key: keys[i%len(keys)], Limit: 1_000_000_000, DurationMs: 1000, Behavior: behavior}
			}
			t0 := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := c.clients[0].Check(ctx, req)
			cancel()
			mine = append(mine, time.Since(t0))
			if err != nil || resp.Responses[0].Error != "" || resp.Responses[0].Status != pb.Status_UNDER_LIMIT {
				b.Errorf("check: %v %v", resp, err)
				return
			}
		}
		lat.Add(mine)
	})
	lat.Report(b, time.Since(start), items)
}

// BenchmarkForwarded measures checks that node 0 forwards to their owners
// in a 3-node loopback cluster, batched and unbatched, at 64 concurrent
// clients sending 1 or 10 checks a request, and at 4 clients to see latency
// without queueing. Client, nodes and owners share
// this process and its cores.
func BenchmarkForwarded(b *testing.B) {
	c := startCluster(b, 3)
	keys := c.keysNotOwnedBy(0, 10_000)
	for _, load := range []struct{ items, clients int }{{1, 64}, {10, 64}, {1, 4}} {
		for _, behavior := range []pb.Behavior{pb.Behavior_BATCHED, pb.Behavior_UNBATCHED} {
			name := fmt.Sprintf("%s/items=%d/clients=%d", behavior, load.items, load.clients)
			b.Run(name, func(b *testing.B) { benchChecks(b, c, behavior, keys, load.items, load.clients) })
		}
	}
}

// BenchmarkHotKey measures one hot key owned by another node: GLOBAL
// answers from node 0's grant, BATCHED forwards every check.
func BenchmarkHotKey(b *testing.B) {
	c := startCluster(b, 3)
	hot := c.keysNotOwnedBy(0, 1)
	for _, behavior := range []pb.Behavior{pb.Behavior_GLOBAL, pb.Behavior_BATCHED} {
		b.Run(behavior.String(), func(b *testing.B) { benchChecks(b, c, behavior, hot, 1, 64) })
	}
}
