package e2e

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/client"
)

// BenchmarkLeasedNodeCPU measures what a hot key's checks cost the node,
// from 50 concurrent callers of one Go client: leased (decided in the
// process, the node taking one report a round) and, as the baseline in
// the same run, not leased (the batching client's Allow, every check
// decided by the node). server-cpu-µs/check is the rlnode process's
// user+system CPU over the run divided by the checks. The limit is far
// above the load, so every check is admitted.
func BenchmarkLeasedNodeCPU(b *testing.B) {
	c := startCluster(b, 1)
	n := c.nodes[0]
	for _, leased := range []bool{true, false} {
		name := "batching"
		if leased {
			name = "leased"
		}
		b.Run(name, func(b *testing.B) {
			cl, err := client.New(n.grpc)
			if err != nil {
				b.Fatal(err)
			}
			defer cl.Close()
			l := client.Limit{Name: "bench-" + name, Count: 1_000_000_000, Period: time.Second, Lease: leased}
			if leased {
				for range 100_000 { // a round's demand, so that grants are sized for the run's
					cl.Allow(context.Background(), l, "hot")
				}
				time.Sleep(2 * client.DefaultLeaseInterval)
			}
			b.SetParallelism(max(1, 50/runtime.GOMAXPROCS(0))) // 50 callers on 2 cores
			cpu0, cpuErr := processCPU(n.cmd.Process.Pid)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if ok, err := cl.Allow(context.Background(), l, "hot"); !ok || err != nil {
						b.Errorf("refused: %v", err)
						return
					}
				}
			})
			b.StopTimer()
			if cpu1, err := processCPU(n.cmd.Process.Pid); cpuErr == nil && err == nil {
				b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "server-cpu-µs/check")
			}
		})
	}
}
