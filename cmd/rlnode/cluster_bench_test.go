package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// keysNotOwnedBy returns n keys whose owner is not node i, so that checks
// sent to node i are all forwarded.
func (c *testCluster) keysNotOwnedBy(i, n int) []string {
	r := c.nodes[i].cluster.Ring()
	self := c.nodes[i].cluster.LocalMember().Name
	var keys []string
	for k := 0; len(keys) < n; k++ {
		key := fmt.Sprint("bench:", k)
		if o, _ := r.Owner(key); o.Name != self {
			keys = append(keys, key)
		}
	}
	return keys
}

// latencies collects per-check latencies from parallel workers.
type latencies struct {
	mu  sync.Mutex
	all []time.Duration
}

func (l *latencies) add(ds []time.Duration) {
	l.mu.Lock()
	l.all = append(l.all, ds...)
	l.mu.Unlock()
}

// report adds checks/s, and p50 and p99 request latency, to b's results.
func (l *latencies) report(b *testing.B, elapsed time.Duration, items int) {
	slices.Sort(l.all)
	if len(l.all) == 0 {
		return
	}
	q := func(p float64) float64 { return float64(l.all[int(p*float64(len(l.all)-1))].Microseconds()) }
	b.ReportMetric(float64(len(l.all)*items)/elapsed.Seconds(), "checks/s")
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
}

// benchChecks runs b.N requests of items checks each, keys taken in turn
// from keys, through node 0 from clients concurrent clients (a multiple of
// GOMAXPROCS). Latencies are per request.
func benchChecks(b *testing.B, c *testCluster, behavior pb.Behavior, keys []string, items, clients int) {
	var lat latencies
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
		lat.add(mine)
	})
	lat.report(b, time.Since(start), items)
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
