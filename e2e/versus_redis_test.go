package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/internal/latency"
)

// startRedis runs a redis-server of its own on a free loopback port, with
// persistence off, until the benchmark ends, and returns its address and
// process ID.
func startRedis(b *testing.B) (string, int) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		b.Skip("the Redis baseline needs redis-server (apt-get install redis-server)")
	}
	port := freePorts(b, 1)[0]
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := loopback(port)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	poll(b, 10*time.Second, "redis answers PING", func() (bool, string) {
		err := rdb.Ping(context.Background()).Err()
		return err == nil, fmt.Sprint(err)
	})
	return addr, cmd.Process.Pid
}

// BenchmarkVersusRedis runs one workload against one rlnode and against a
// Redis+Lua limiter (go-redis/redis_rate: GCRA in a Lua script, the usual
// way to rate-limit with Redis) on the same machine, in one run: 50
// concurrent callers, one check per call, over 10,000 keys, limits high
// enough that every check is admitted. Each gets the same CPUs; the
// ratio of the checks/s figures is the comparison, and server-cpu-µs/check
// is the server process's user+system CPU over the run (rlnode, or
// redis-server) divided by the checks answered. ringlimit runs three
// ways: the Go client's Allow, which batches concurrent calls into one
// RPC (what an application calling client.Allow gets); one RPC per check
// (the client WithoutBatching); and 100 checks a request, which
// ringlimit's API allows and redis_rate's does not.
func BenchmarkVersusRedis(b *testing.B) {
	redisAddr, redisPID := startRedis(b)
	c := startCluster(b, 1)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 64})
	b.Cleanup(func() { rdb.Close() })
	lim := redis_rate.NewLimiter(rdb)
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprint("bench:", i)
	}
	n := c.nodes[0]
	unbatched, err := client.Open([]string{n.grpc}, client.WithoutBatching())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unbatched.Close() })
	batching, err := client.New(n.grpc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { batching.Close() })
	limit := client.Limit{Name: "bench", Count: 1_000_000, Period: time.Second, Algorithm: pb.Algorithm_GCRA}
	checks := func(cl *client.Client) func(ctx context.Context, keys []string) (bool, error) {
		return func(ctx context.Context, keys []string) (bool, error) {
			req := &pb.CheckRequest{Requests: make([]*pb.CheckItem, len(keys))}
			for i, key := range keys {
				req.Requests[i] = limit.Item(key, 1)
			}
			resp, err := cl.Check(ctx, req)
			return err == nil && resp.Responses[0].Status == pb.Status_UNDER_LIMIT, err
		}
	}
	limiters := []struct {
		name  string
		pid   int // the server process
		batch int // checks per call
		allow func(ctx context.Context, keys []string) (bool, error)
	}{
		{"redis_rate", redisPID, 1, func(ctx context.Context, keys []string) (bool, error) {
			res, err := lim.Allow(ctx, keys[0], redis_rate.Limit{Rate: 1_000_000, Burst: 1_000_000, Period: time.Second})
			return err == nil && res.Allowed > 0, err
		}},
		{"ringlimit-client-allow", n.cmd.Process.Pid, 1, func(ctx context.Context, keys []string) (bool, error) {
			return batching.Allow(ctx, limit, keys[0])
		}},
		{"ringlimit-grpc-unbatched", n.cmd.Process.Pid, 1, checks(unbatched)},
		// redis_rate has no multi-key call: batching is ringlimit's own.
		{"ringlimit-grpc-100-per-request", n.cmd.Process.Pid, 100, checks(unbatched)},
	}
	for _, l := range limiters {
		b.Run(l.name, func(b *testing.B) {
			var lat latency.Recorder
			b.SetParallelism(max(1, 50/runtime.GOMAXPROCS(0))) // 50 callers on 2 cores
			cpu0, cpuErr := processCPU(l.pid)
			start := time.Now()
			var workers atomic.Int64
			b.RunParallel(func(p *testing.PB) {
				i := int(workers.Add(1)) * 7919
				var mine []time.Duration
				for p.Next() {
					i = (i + l.batch) % (len(keys) - l.batch)
					ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
					t0 := time.Now()
					ok, err := l.allow(ctx, keys[i:i+l.batch])
					mine = append(mine, time.Since(t0))
					cancel()
					if !ok {
						b.Errorf("%s: not admitted: %v", l.name, err)
						return
					}
				}
				lat.Add(mine)
			})
			elapsed := time.Since(start)
			cpu1, err := processCPU(l.pid)
			if cpuErr == nil && err == nil {
				b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N*l.batch), "server-cpu-µs/check")
			}
			lat.Report(b, elapsed, l.batch)
		})
	}
}
