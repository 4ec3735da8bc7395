package mux

import (
	"context"
	"fmt"
	"runtime"
	"testing"
)

// BenchmarkServe measures a request and its answer on one stream over
// loopback, client and server in this process, with a handler that
// answers at once (as a node decides a check in its own store): from one
// caller, the receiving goroutine decides each request itself; from 16,
// up to Workers are decided at once.
func BenchmarkServe(b *testing.B) {
	for _, callers := range []int{1, 16} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			c, _ := dial(b, serve(b, newServer(newNode())))
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
