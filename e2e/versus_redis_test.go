package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/latency"
)

// startRedis runs a redis-server of its own on a free loopback port, with
// persistence off, until the benchmark ends.
func startRedis(b *testing.B) string {
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
	return addr
}

// BenchmarkVersusRedis runs one workload against one rlnode and against a
// Redis+Lua limiter (go-redis/redis_rate: GCRA in a Lua script, the usual
// way to rate-limit with Redis) on the same machine, in one run: 64
// concurrent clients, one check per request, over 10,000 keys, limits high
// enough that every check is admitted. Each gets the same CPUs; the
// ratio of the checks/s figures is the comparison. A third run sends 100
// checks a request, which ringlimit's API allows and redis_rate's does not.
func BenchmarkVersusRedis(b *testing.B) {
	redisAddr := startRedis(b)
	c := startCluster(b, 1)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 64})
	b.Cleanup(func() { rdb.Close() })
	lim := redis_rate.NewLimiter(rdb)
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprint("bench:", i)
	}
	n := c.nodes[0]
	ringlimit := func(ctx context.Context, keys []string) (bool, error) {
		req := &pb.CheckRequest{Requests: make([]*pb.CheckItem, len(keys))}
		for i, key := range keys {
			req.Requests[i] = &pb.CheckItem{Name: "bench", Key: key, Limit: 1_000_000, DurationMs: 1000, Algorithm: pb.Algorithm_GCRA}
		}
		resp, err := n.client.Check(ctx, req)
		return err == nil && resp.Responses[0].Status == pb.Status_UNDER_LIMIT, err
	}
	limiters := []struct {
		name  string
		batch int // checks per request
		allow func(ctx context.Context, keys []string) (bool, error)
	}{
		{"redis_rate", 1, func(ctx context.Context, keys []string) (bool, error) {
			res, err := lim.Allow(ctx, keys[0], redis_rate.Limit{Rate: 1_000_000, Burst: 1_000_000, Period: time.Second})
			return err == nil && res.Allowed > 0, err
		}},
		{"ringlimit-grpc", 1, ringlimit},
		// redis_rate has no multi-key call: batching is ringlimit's own.
		{"ringlimit-grpc-100-per-request", 100, ringlimit},
	}
	for _, l := range limiters {
		b.Run(l.name, func(b *testing.B) {
			var lat latency.Recorder
			b.SetParallelism(32) // 64 clients on 2 cores
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
			lat.Report(b, time.Since(start), l.batch)
		})
	}
}
