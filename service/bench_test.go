package service

import (
	"context"
	"fmt"
	"testing"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// BenchmarkCheck measures a node's own work for one request (validation,
// routing, the store and the algorithm), without any transport, for 1 and
// 100 checks a request.
func BenchmarkCheck(b *testing.B) {
	for _, items := range []int{1, 100} {
		b.Run(fmt.Sprintf("items=%d", items), func(b *testing.B) {
			s := New(Config{})
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
