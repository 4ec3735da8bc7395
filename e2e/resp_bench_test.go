package e2e

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ringlimit/ringlimit/internal/latency"
)

// gcraLua is GCRA in a Redis script with redis-cell's arguments and
// answer (KEYS[1]; ARGV: max_burst, count per period, period in seconds,
// quantity), so that redis-server and ringlimit's RESP port run the same
// command: the way to limit with Redis when its modules cannot be loaded.
// Times are whole microseconds of Redis's clock, the TAT stored as one
// integer with a time-to-live of when it has passed.
const gcraLua = `
local burst, count, period, quantity = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = math.floor(period * 1000000 / count)
local tolerance = interval * (burst + 1)
local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or now), now)
local nextTAT = tat + interval * quantity
local limited, retry, ahead = 0, -1, nextTAT - now
if nextTAT - tolerance > now then
	limited, ahead = 1, tat - now
	if interval * quantity <= tolerance then
		retry = math.ceil((nextTAT - tolerance - now) / 1000000)
	end
elseif ahead > 0 then
	redis.call('SET', KEYS[1], string.format('%.0f', nextTAT), 'PX', math.ceil(ahead / 1000))
end
return {limited, burst + 1, math.max(math.floor((tolerance - ahead) / interval), 0), retry, math.ceil(ahead / 1000000)}
`

// BenchmarkRESPVersusRedis runs one load, in one run, through ringlimit's
// RESP port (CL.THROTTLE) and against redis-server running gcraLua (the
// same arguments and answers), with the same go-redis client: 1, 4, 16
// and 64 callers, each one command at a time or pipelines of 16, over
// 10,000 keys, every check admitted. checks/s counts answered commands;
// server-cpu-µs/check is the server process's user+system CPU over the
// run divided by the commands (rlnode with its default GOMAXPROCS, Redis
// single-threaded). Callers run in this process, on the same cores.
func BenchmarkRESPVersusRedis(b *testing.B) {
	redisAddr, redisPID := startRedis(b)
	c, respAddr := startRESPCluster(b, 1)
	n := c.nodes[0]
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "bench:" + strconv.Itoa(i)
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 64})
	b.Cleanup(func() { rdb.Close() })
	script := redis.NewScript(gcraLua)
	if err := script.Load(context.Background(), rdb).Err(); err != nil {
		b.Fatal(err)
	}
	rl := redis.NewClient(&redis.Options{Addr: respAddr(n), PoolSize: 64})
	b.Cleanup(func() { rl.Close() })
	args := func(key string) []any { return []any{key, 999_999, 1_000_000, 1, 1} }
	servers := []struct {
		name string
		pid  int
		rdb  *redis.Client
		cmd  func(ctx context.Context, p respCaller, key string) *redis.Cmd
	}{
		{"redis-lua", redisPID, rdb, func(ctx context.Context, p respCaller, key string) *redis.Cmd {
			return p.EvalSha(ctx, script.Hash(), []string{key}, args(key)[1:]...)
		}},
		{"ringlimit-resp", n.cmd.Process.Pid, rl, func(ctx context.Context, p respCaller, key string) *redis.Cmd {
			return p.Do(ctx, append([]any{"CL.THROTTLE"}, args(key)...)...)
		}},
	}
	for _, depth := range []int{1, 16} {
		for _, callers := range []int{1, 4, 16, 64} {
			for _, s := range servers {
				b.Run(fmt.Sprintf("depth=%d/callers=%d/%s", depth, callers, s.name), func(b *testing.B) {
					runRESPLoad(b, s.pid, callers, depth, keys, func(ctx context.Context, keys []string) error {
						if depth == 1 {
							return checkAdmitted(s.cmd(ctx, s.rdb, keys[0]))
						}
						pipe := s.rdb.Pipeline()
						cmds := make([]*redis.Cmd, len(keys))
						for i, k := range keys {
							cmds[i] = s.cmd(ctx, pipe, k)
						}
						if _, err := pipe.Exec(ctx); err != nil {
							return err
						}
						for _, cmd := range cmds {
							if err := checkAdmitted(cmd); err != nil {
								return err
							}
						}
						return nil
					})
				})
			}
		}
	}
}

// respCaller is what a client and a pipeline both do.
type respCaller interface {
	Do(ctx context.Context, args ...any) *redis.Cmd
	EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd
}

// checkAdmitted is nil for an answer that admits (its first integer 0).
func checkAdmitted(cmd *redis.Cmd) error {
	v, err := cmd.Int64Slice()
	switch {
	case err != nil:
		return err
	case len(v) != 5 || v[0] != 0:
		return fmt.Errorf("answer %v, want an admitted check", v)
	}
	return nil
}

// runRESPLoad makes b.N checks in calls of depth checks from callers
// goroutines, and reports checks/s, latency per call and the server's
// CPU per check.
func runRESPLoad(b *testing.B, pid, callers, depth int, keys []string, call func(context.Context, []string) error) {
	var lat latency.Recorder
	var next atomic.Int64
	calls := int64((b.N + depth - 1) / depth)
	cpu0, cpuErr := processCPU(pid)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range callers {
		wg.Go(func() {
			var mine []time.Duration
			i := w * 7919
			for next.Add(1) <= calls {
				i = (i + depth) % (len(keys) - depth)
				ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
				t0 := time.Now()
				err := call(ctx, keys[i:i+depth])
				mine = append(mine, time.Since(t0))
				cancel()
				if err != nil {
					b.Error(err)
					return
				}
			}
			lat.Add(mine)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu1, err := processCPU(pid)
	if cpuErr == nil && err == nil {
		b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(calls*int64(depth)), "server-cpu-µs/check")
	}
	lat.Report(b, elapsed, depth)
}
