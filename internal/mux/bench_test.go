package mux

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// BenchmarkServe measures a request and its answer on one stream over
// loopback, client and server in this process, with a handler that
// answers at once (as a node decides a check in its own store): from one
// caller, the receiving goroutine decides each request itself; from 16,
// up to Workers are decided at once.
func BenchmarkServe(b *testing.B) {
	for _, callers := range []int{1, 16} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			n := newNode()
			n.sr.Handle = answerAtOnce
			c, _ := dial(b, serve(b, newServer(n)))
			b.ReportAllocs()
			b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
			if callers == 1 {
				for b.Loop() {
					if err := call(context.Background(), c, "k", 1); err != nil {
						b.Fatal(err)
					}
				}
				return
			}
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := call(context.Background(), c, "k", 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// answerAtOnce answers each item of req with its limit, waiting for
// nothing.
func answerAtOnce(_ context.Context, req *pb.CheckStreamRequest) *pb.CheckStreamResponse {
	resp := &pb.CheckStreamResponse{Id: req.GetId()}
	for _, it := range req.GetRequests() {
		resp.Responses = append(resp.Responses, &pb.CheckResult{Limit: it.GetLimit()})
	}
	return resp
}
