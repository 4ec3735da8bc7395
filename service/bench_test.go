package service

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// BenchmarkCheck measures a node's own work for one request (validation,
// routing, the store and the algorithm), without any transport, for 1 and
// 100 checks a request.
func BenchmarkCheck(b *testing.B) { benchCheck(b, func() Config { return Config{} }) }

// benchCheck is BenchmarkCheck of a service configured by conf.
func benchCheck(b *testing.B, conf func() Config) {
	for _, items := range []int{1, 100} {
		b.Run(fmt.Sprintf("items=%d", items), func(b *testing.B) {
			s := New(conf())
			req := &pb.CheckRequest{}
			for i := range items {
				req.Requests = append(req.Requests, &pb.CheckItem{Name: "api", Key: fmt.Sprint("user:", i), Limit: 1_000_000_000, DurationMs: 1000})
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Check(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*items)/b.Elapsed().Seconds(), "checks/s")
		})
	}
}

// BenchmarkCheckParallel is BenchmarkCheck's request of one check from
// concurrent callers, each with keys of its own, as a node serves many
// clients at once: what the decisions share (locks, counters of the
// service) shows here, not in BenchmarkCheck.
func BenchmarkCheckParallel(b *testing.B) {
	s := New(Config{})
	ctx := context.Background()
	var callers atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(p *testing.PB) {
		caller := callers.Add(1)
		reqs := make([]*pb.CheckRequest, 64)
		for i := range reqs {
			reqs[i] = &pb.CheckRequest{Requests: []*pb.CheckItem{{Name: "api", Key: fmt.Sprint("user:", caller, ":", i), Limit: 1_000_000_000, DurationMs: 1000}}}
		}
		for i := 0; p.Next(); i++ {
			if _, err := s.Check(ctx, reqs[i%len(reqs)]); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
}

// BenchmarkGlobal measures GLOBAL checks from concurrent callers: at a
// node answering from the grants it holds for 1,000 hot keys another node
// owns (grant), and at that owner (owner), while sync rounds run beside
// them every millisecond, as --global-sync does every 100ms.
func BenchmarkGlobal(b *testing.B) {
	for _, side := range []string{"grant", "owner"} {
		b.Run(side, func(b *testing.B) {
			c, svcs := newFakeCluster(2)
			reqs := make([]*pb.CheckRequest, 1000)
			for i := range reqs {
				var key string
				for k := 0; ; k++ { // distinct keys, all owned by node 1
					key = fmt.Sprint("hot-", i, "-", k)
					if o, _ := c.ring.Owner(key); o.Name == "node-1" {
						break
					}
				}
				reqs[i] = &pb.CheckRequest{Requests: []*pb.CheckItem{{
					Name: "api", Key: key, Limit: 1_000_000_000, DurationMs: 3_600_000, Behavior: pb.Behavior_GLOBAL,
				}}}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for _, req := range reqs { // no grant yet: forwarded, and asks for one
				if _, err := svcs[0].Check(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			syncRound(svcs)
			node := svcs[0]
			if side == "owner" {
				node = svcs[1]
			}
			syncing := make(chan struct{})
			go func() {
				defer close(syncing)
				t := time.NewTicker(time.Millisecond)
				defer t.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-t.C:
						syncRound(svcs)
					}
				}
			}()
			var next atomic.Int64
			b.ResetTimer()
			b.RunParallel(func(p *testing.PB) {
				i := next.Add(7919)
				for p.Next() {
					resp, err := node.Check(ctx, reqs[i%int64(len(reqs))])
					if err != nil || resp.Responses[0].Status != pb.Status_UNDER_LIMIT {
						b.Errorf("check: %v %v", resp, err)
						return
					}
					i++
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
			cancel()
			<-syncing
		})
	}
}

// BenchmarkReserveSettle measures a reservation's whole life at the
// owner, without transport: a check that reserves 1,000 hits and the
// settle that charges 400 of them and gives the rest back, against
// BenchmarkCheck/items=1, one check that spends its hits.
func BenchmarkReserveSettle(b *testing.B) {
	s := New(Config{})
	ttl, cost := int64(100), int64(400) // expired records are dropped as the benchmark goes, as on a node
	hits := int64(1000)
	req := &pb.CheckRequest{Requests: []*pb.CheckItem{{Name: "tokens", Key: "tenant", Limit: 1_000_000_000, DurationMs: 1000,
		Hits: &hits, ReserveTtlMs: &ttl}}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		resp, err := s.Check(ctx, req)
		if err != nil || resp.Responses[0].ReservationId == "" {
			b.Fatal(resp, err)
		}
		if _, err := s.Settle(ctx, &pb.SettleRequest{ReservationId: resp.Responses[0].ReservationId, Name: "tokens", Key: "tenant", Cost: &cost}); err != nil {
			b.Fatal(err)
		}
	}
}
