package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

func TestQuantile(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		var out []time.Duration
		for _, n := range ns {
			out = append(out, time.Duration(n)*time.Millisecond)
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	for _, tc := range []struct {
		sorted []time.Duration
		q      float64
		want   time.Duration
	}{
		{nil, 0.99, 0},
		{ms(7), 0.5, 7 * time.Millisecond},
		{ms(7), 0, 7 * time.Millisecond},
		{ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},  // rank ceil(2) = 2
		{ms(1, 2, 3, 4), 0.51, 3 * time.Millisecond}, // rank ceil(2.04) = 3
		{ms(1, 2, 3, 4), 1, 4 * time.Millisecond},
		{ms(hundred...), 0.99, 99 * time.Millisecond},
		{ms(hundred...), 0.999, 100 * time.Millisecond},
	} {
		if got := quantile(tc.sorted, tc.q); got != tc.want {
			t.Errorf("quantile(%v, %v) = %v, want %v", tc.sorted, tc.q, got, tc.want)
		}
	}
}

func TestParseRedisCPU(t *testing.T) {
	info := "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:0.011702\r\nused_cpu_sys_children:9.000000\r\n" +
		"used_cpu_user_children:9.000000\r\nused_cpu_sys_main_thread:9.000000\r\n"
	got, err := parseRedisCPU(info)
	if want := 1261702 * time.Microsecond; err != nil || got != want {
		t.Errorf("parseRedisCPU = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{
		"# CPU\r\nused_cpu_sys:1.0\r\n",
		"used_cpu_sys:1.0\r\nused_cpu_user:-1\r\n",
		"used_cpu_sys:NaN\r\nused_cpu_user:1\r\n",
		"used_cpu_sys:1\r\nused_cpu_user:+Inf\r\n",
		"used_cpu_sys:1\r\nused_cpu_user:lots\r\n",
	} {
		if _, err := parseRedisCPU(bad); err == nil || !strings.Contains(err.Error(), "redis INFO cpu") {
			t.Errorf("parseRedisCPU(%q): %v, want an error", bad, err)
		}
	}
}

// testRedis starts a redis-server for the test, or skips it where there
// is none.
func testRedis(t *testing.T) (*proc, *redis.Client) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("needs redis-server (apt-get install redis-server)")
	}
	p, addr, err := startRedis(t.Context(), bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.stop(stopGrace) })
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 4})
	t.Cleanup(func() { rdb.Close() })
	return p, rdb
}

func TestRedisLoad(t *testing.T) {
	_, rdb := testRedis(t)
	lim := redis_rate.NewLimiter(rdb)
	cpu := func(ctx context.Context) (time.Duration, error) { return redisCPU(ctx, rdb) }
	testLoad(t, redisRate(lim), cpu, func(ctx context.Context, key string) (bool, error) {
		res, err := lim.Allow(ctx, key, redis_rate.PerHour(1))
		return err == nil && res.Allowed > 0, err
	})
}

// testLoad runs loads of check: one of a count, one of a duration, one
// cancelled, and one of hourly, a check under a limit of one an hour, on
// a key it has admitted once, so that its checks are all refused; a
// refusal counts as answered. (A load of check itself cannot be refused:
// ringlimit fits a counter to the limit each check names, so a key spent
// under another limit is not spent under check's.) The hourly key is one
// the other loads did not check: a check of it in their last millisecond
// (the RESP port's clock) would find its counter a microsecond spent,
// which is more than an hourly limit has.
func testLoad(t *testing.T, check check, cpu func(context.Context) (time.Duration, error), hourly check) {
	t.Run("count", func(t *testing.T) {
		raw, err := measureRedis(t.Context(), check, cpu, load{Concurrency: 4, Duration: time.Minute, Count: 300, Keys: 10, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := decodeReport(raw)
		if err != nil {
			t.Fatal(err)
		}
		l := rep.LatencyUs
		if rep.Requests != 300 || rep.Answered != 300 || rep.Admitted != 300 || rep.Errors != 0 || rep.FirstError != "" || rep.ChecksPerSec <= 0 ||
			!(0 < l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.P999 && l.P999 <= l.Max) ||
			rep.CPUUsPerCheck == nil || *rep.CPUUsPerCheck < 0 {
			t.Errorf("300 calls: report %s", raw)
		}
	})
	t.Run("duration", func(t *testing.T) {
		rep := redisLoad(t.Context(), check, load{Concurrency: 4, Duration: 100 * time.Millisecond, Count: maxCount, Keys: 10, Timeout: 5 * time.Second})
		if rep.Requests == 0 || rep.Requests >= maxCount || rep.Errors != 0 || rep.Seconds <= 0 {
			t.Errorf("100ms: %+v, want some calls, all answered", rep)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		rep := redisLoad(ctx, check, load{Concurrency: 4, Duration: time.Hour, Count: maxCount, Keys: 10, Timeout: 5 * time.Second})
		if rep.Requests != 0 {
			t.Errorf("cancelled: %+v, want no calls", rep)
		}
	})
	t.Run("refused", func(t *testing.T) {
		if ok, err := hourly(t.Context(), "hourly:0"); !ok || err != nil {
			t.Fatalf("the first check of the hour: admitted %v, %v; want admitted", ok, err)
		}
		rep := redisLoad(t.Context(), hourly, load{Concurrency: 1, Duration: time.Minute, Count: 5, Keys: 1, Prefix: "hourly:", Timeout: 5 * time.Second})
		if rep.Refused != 5 || rep.Admitted != 0 || rep.Answered != 5 || rep.Errors != 0 {
			t.Errorf("refused: %+v, want 5 refused and answered", rep)
		}
	})
}

// TestRESPLoad runs the loads of CL.THROTTLE against a real rlnode's RESP
// port, with the node's CPU from its /metrics.
func TestRESPLoad(t *testing.T) {
	n, err := startNode(t.Context(), buildRLNode(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.stop(stopGrace) })
	rl := redis.NewClient(&redis.Options{Addr: n.RESP, PoolSize: 4})
	t.Cleanup(func() { rl.Close() })
	testLoad(t, clThrottle(rl), n.cpu, func(ctx context.Context, key string) (bool, error) {
		v, err := rl.Do(ctx, "CL.THROTTLE", key, 0, 1, 3600, 1).Int64Slice()
		if err == nil && len(v) != 5 {
			err = fmt.Errorf("CL.THROTTLE answered %v, want 5 integers", v)
		}
		return err == nil && v[0] == 0, err
	})
}

func TestParseProcessCPU(t *testing.T) {
	scrape := "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n" +
		"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.34\nprocess_open_fds 9\n"
	if got, err := parseProcessCPU(scrape); err != nil || got != 12340*time.Millisecond {
		t.Errorf("parseProcessCPU = %v, %v; want 12.34s", got, err)
	}
	for _, bad := range []string{"", "process_open_fds 9\n", "process_cpu_seconds_total -1\n", "process_cpu_seconds_total NaN\n", "process_cpu_seconds_total lots\n"} {
		if _, err := parseProcessCPU(bad); err == nil || !strings.Contains(err.Error(), "process_cpu_seconds_total") {
			t.Errorf("parseProcessCPU(%q): %v, want an error", bad, err)
		}
	}
}

func TestStopRedis(t *testing.T) {
	p, rdb := testRedis(t)
	p.stop(stopGrace)
	select {
	case <-p.done:
	default:
		t.Fatal("stop returned before redis-server exited")
	}
	// Calls to a server that is gone fail, are counted, and end the run
	// at its count.
	rep := redisLoad(t.Context(), redisRate(redis_rate.NewLimiter(rdb)), load{Concurrency: 2, Duration: time.Minute, Count: 4, Keys: 10, Timeout: time.Second})
	if rep.Requests != 4 || rep.Errors != 4 || rep.Answered != 0 || rep.FirstError == "" {
		t.Errorf("after stop: %+v, want 4 failed calls", rep)
	}
	p.stop(stopGrace) // a second stop (as a deferred one after an error) returns too
}
