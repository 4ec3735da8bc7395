package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// stopGrace is how long a server has to exit after SIGTERM before it is
// killed; rlnode runs with --shutdown-timeout 2s.
const stopGrace = 5 * time.Second

// measure starts one rlnode and one redis-server, warms both up (each
// mode once, for conf.Warmup, unrecorded), runs every mode conf.Rounds
// times at every concurrency level (the modes one after another at each
// level, each round starting at the next mode, so that a noisy moment on
// the shared machine, or a place in the order, touches all of them
// alike), and stops both servers before it returns. Progress goes to log.
func measure(ctx context.Context, conf config, log io.Writer) (results, error) {
	res := results{
		Started: time.Now().UTC(), Go: runtime.Version(), CPUs: runtime.NumCPU(),
		DurationS: conf.Duration.Seconds(), Rounds: conf.Rounds, Count: conf.Count, Keys: conf.Keys,
	}
	rp, redisAddr, err := startRedis(ctx, conf.RedisServer)
	if err != nil {
		return results{}, fmt.Errorf("-redis-server: %w", err)
	}
	defer rp.stop(stopGrace)
	n, err := startNode(ctx, conf.RLNode)
	if err != nil {
		return results{}, fmt.Errorf("-rlnode: %w", err)
	}
	defer n.stop(stopGrace)
	pool := conf.Concurrency[len(conf.Concurrency)-1]
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: pool})
	defer rdb.Close()
	rl := redis.NewClient(&redis.Options{Addr: n.RESP, PoolSize: pool})
	defer rl.Close()
	redisLua, redisCPU := redisRate(redis_rate.NewLimiter(rdb)), func(ctx context.Context) (time.Duration, error) { return redisCPU(ctx, rdb) }

	// one runs mode m with c callers for d and returns its report.
	one := func(m mode, c int, d time.Duration) ([]byte, report, error) {
		var raw []byte
		l := load{Concurrency: c, Duration: d, Count: conf.Count, Keys: m.keys(conf), Timeout: conf.Timeout}
		switch {
		case m.RESP:
			raw, err = measureRedis(ctx, clThrottle(rl), n.cpu, l)
		case m.Protocol == "":
			raw, err = measureRedis(ctx, redisLua, redisCPU, l)
		default:
			raw, err = runBench(ctx, conf, n, m, c, d)
		}
		if err != nil {
			return nil, report{}, fmt.Errorf("%s at concurrency %d: %w", m.Name, c, err)
		}
		rep, err := decodeReport(raw)
		if err != nil {
			return nil, report{}, fmt.Errorf("%s at concurrency %d: report: %w", m.Name, c, err)
		}
		return raw, rep, nil
	}
	if conf.Warmup > 0 {
		for _, m := range conf.Modes {
			if _, _, err := one(m, conf.Concurrency[0], conf.Warmup); err != nil {
				return results{}, fmt.Errorf("warm-up: %w", err)
			}
		}
		fmt.Fprintf(log, "warmed up: each mode for %v\n", conf.Warmup)
	}
	for _, c := range conf.Concurrency {
		for r := range conf.Rounds {
			for i := range conf.Modes {
				m := conf.Modes[(i+r)%len(conf.Modes)] // each round starts at another mode: none always runs first
				raw, rep, err := one(m, c, conf.Duration)
				if err != nil {
					return results{}, err
				}
				fmt.Fprintf(log, "%-9s concurrency %3d round %d: %8.0f checks/s  p99 %8.1fµs  errors %d %s\n",
					m.Name, c, r+1, rep.ChecksPerSec, rep.LatencyUs.P99, rep.Errors, rep.FirstError)
				res.Runs = append(res.Runs, run{Mode: m.Name, Concurrency: c, Round: r, Report: raw})
			}
		}
	}
	return res, nil
}

// runBench runs `rlnode bench --json` against n in mode m with c workers
// for d and returns its report. rlnode bench exits 2 when a check failed, and
// still reports: such a report is kept (its errors say so); no report is
// an error. The subprocess is killed if it outlives its run by a minute.
func runBench(ctx context.Context, conf config, n *node, m mode, c int, d time.Duration) ([]byte, error) {
	addr := n.GRPC
	if m.Protocol == "http" {
		addr = n.HTTP
	}
	args := []string{"bench", "--json", "--addr", addr, "--metrics", n.HTTP, "--protocol", m.Protocol,
		"--concurrency", strconv.Itoa(c), "--duration", d.String(),
		"--count", strconv.FormatInt(conf.Count, 10), "--keys", strconv.Itoa(m.keys(conf)),
		"--algorithm", "GCRA", "--limit", "1000000", "--period", "1s", "--timeout", conf.Timeout.String()}
	if conf.BenchWarmup > 0 {
		args = append(args, "--warmup", conf.BenchWarmup.String())
	}
	if m.Client {
		args = append(args, "--client")
	}
	if m.Lease {
		args = append(args, "--lease")
	}
	ctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	bin := conf.RLNode
	if m.Before {
		bin = conf.Before
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout bytes.Buffer
	stderr := &tail{}
	cmd.Stdout, cmd.Stderr = &stdout, stderr
	cmd.SysProcAttr = sysProcAttr()
	err := cmd.Run()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("rlnode bench: %w", ctx.Err())
	}
	if err != nil && !json.Valid(stdout.Bytes()) {
		return nil, fmt.Errorf("rlnode %s: %w: %s", strings.Join(args, " "), err, stderr)
	}
	return bytes.TrimSpace(stdout.Bytes()), nil
}

// keys is how many keys m's runs draw from.
func (m mode) keys(conf config) int {
	if m.Keys > 0 {
		return m.Keys
	}
	return conf.Keys
}

// measureRedis runs the load l of check over the Redis protocol and
// returns its report, with the server's CPU per answered check, from cpu:
// the CPU the server has used so far.
func measureRedis(ctx context.Context, check check, cpu func(context.Context) (time.Duration, error), l load) ([]byte, error) {
	cpu0, err := cpu(ctx)
	if err != nil {
		return nil, err
	}
	rep := redisLoad(ctx, check, l)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	cpu1, err := cpu(ctx)
	if err != nil {
		return nil, err
	}
	if rep.Answered > 0 {
		us := µs(cpu1-cpu0) / float64(rep.Answered)
		rep.CPUUsPerCheck = &us
	}
	return json.Marshal(rep)
}
