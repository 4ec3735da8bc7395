package main

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// load is the shape of one Redis run: what rlnode bench's options say for
// a ringlimit run.
type load struct {
	Concurrency int           // callers, each with one call in flight
	Duration    time.Duration // the run stops after this long ...
	Count       int64         // ... or after this many calls in total
	Keys        int           // keys <Prefix>0 .. <Prefix><Keys-1>, drawn uniformly
	Prefix      string        // of the keys; "" means "bench:", as rlnode bench's
	Timeout     time.Duration // one call's longest
}

// redisLimit admits every check of a run: a million a second per key,
// over keys that each see a few thousand a second at most. redis_rate is
// GCRA; the ringlimit runs ask for GCRA too.
var redisLimit = redis_rate.Limit{Rate: 1_000_000, Burst: 1_000_000, Period: time.Second}

// check makes one check of key over the Redis protocol: whether it was
// admitted, or why it was not answered.
type check func(ctx context.Context, key string) (admitted bool, err error)

// redisRate checks with go-redis/redis_rate's Lua GCRA, at redisLimit.
func redisRate(lim *redis_rate.Limiter) check {
	return func(ctx context.Context, key string) (bool, error) {
		res, err := lim.Allow(ctx, key, redisLimit)
		return err == nil && res.Allowed > 0, err
	}
}

// clThrottle checks with CL.THROTTLE on ringlimit's RESP port
// (docs/resp.md), at redisLimit: max_burst is the burst less one, the
// period one second.
func clThrottle(rdb *redis.Client) check {
	return func(ctx context.Context, key string) (bool, error) {
		v, err := rdb.Do(ctx, "CL.THROTTLE", key, redisLimit.Burst-1, redisLimit.Rate, int64(redisLimit.Period/time.Second), 1).Int64Slice()
		if err == nil && len(v) != 5 {
			err = fmt.Errorf("CL.THROTTLE answered %v, want 5 integers", v)
		}
		return err == nil && v[0] == 0, err
	}
}

// redisLoad runs l.Concurrency callers of check, one check a call,
// until l.Count calls have been made in total, l.Duration has passed, or
// ctx ends, and reports them as rlnode bench reports its runs: latency is
// per call, and checks/s counts answered checks (admitted or refused).
// Calls cut off by ctx count as failed. CPUUsPerCheck is left nil: the
// caller measures the server.
func redisLoad(ctx context.Context, check check, l load) report {
	keys := make([]string, l.Keys)
	for i := range keys {
		keys[i] = cmp.Or(l.Prefix, "bench:") + strconv.Itoa(i)
	}
	type worker struct {
		lat                     []time.Duration
		admitted, refused, errs int64
		firstErr                error
	}
	workers := make([]worker, l.Concurrency)
	var issued atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(l.Duration)
	for i := range workers {
		w := &workers[i]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 0)) // repeatable, as rlnode bench's workers are
			for ctx.Err() == nil && time.Now().Before(deadline) && issued.Add(1) <= l.Count {
				key := keys[rng.IntN(len(keys))]
				cctx, cancel := context.WithTimeout(ctx, l.Timeout)
				t0 := time.Now()
				admitted, err := check(cctx, key)
				w.lat = append(w.lat, time.Since(t0))
				cancel()
				switch {
				case err != nil:
					w.errs++
					if w.firstErr == nil {
						w.firstErr = err
					}
				case admitted:
					w.admitted++
				default:
					w.refused++
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	rep := report{Schema: reportSchema, Seconds: elapsed.Seconds()}
	var lat []time.Duration
	for _, w := range workers {
		lat = append(lat, w.lat...)
		rep.Admitted += w.admitted
		rep.Refused += w.refused
		rep.Errors += w.errs
		if rep.FirstError == "" && w.firstErr != nil {
			rep.FirstError = w.firstErr.Error()
		}
	}
	rep.Requests = int64(len(lat))
	rep.Answered = rep.Admitted + rep.Refused
	if rep.Seconds > 0 {
		rep.ChecksPerSec = float64(rep.Answered) / rep.Seconds
	}
	slices.Sort(lat)
	rep.LatencyUs = latencyUs{
		P50: µs(quantile(lat, 0.50)), P90: µs(quantile(lat, 0.90)), P99: µs(quantile(lat, 0.99)),
		P999: µs(quantile(lat, 0.999)), Max: µs(quantile(lat, 1)),
	}
	return rep
}

// quantile is the q-quantile of sorted by nearest rank (the smallest value
// with at least q of the values at or below it), as rlnode bench's
// histogram defines it; 0 for no values.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(q * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func µs(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// redisCPU is the CPU the server behind rdb has used so far, user and
// system, as its INFO cpu section states (getrusage of the process, in
// µs): the same figure /proc/PID/stat holds, in finer units than its
// 10ms ticks.
func redisCPU(ctx context.Context, rdb *redis.Client) (time.Duration, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("redis INFO cpu: %w", err)
	}
	return parseRedisCPU(info)
}

// parseRedisCPU adds used_cpu_sys and used_cpu_user from the text of
// INFO cpu.
func parseRedisCPU(info string) (time.Duration, error) {
	var sum time.Duration
	found := 0
	for line := range strings.Lines(info) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "used_cpu_sys" && name != "used_cpu_user") {
			continue
		}
		s, err := strconv.ParseFloat(value, 64)
		if err != nil || !(s >= 0) || math.IsInf(s, 1) { // NaN fails s >= 0
			return 0, fmt.Errorf("redis INFO cpu: %s: %q, want seconds", name, value)
		}
		sum += time.Duration(s * float64(time.Second))
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("redis INFO cpu: want used_cpu_sys and used_cpu_user, found %d of them", found)
	}
	return sum, nil
}
