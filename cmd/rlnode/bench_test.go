package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// benchOpts are small runs bounded by Count. Duration is only a safety
// net, generous so that a loaded machine running -race still reaches Count.
func benchOpts(protocol, addr string) benchOptions {
	return benchOptions{
		Addrs: []string{addr}, Protocol: protocol, Items: 1, Concurrency: 8,
		Duration: 30 * time.Second, Count: 2000, Keys: 100, Name: "bench",
		Behavior: pb.Behavior_BATCHED, Algorithm: pb.Algorithm_TOKEN_BUCKET,
		Limit: 1_000_000, Period: time.Second, Timeout: 5 * time.Second,
	}
}

func checkReport(t *testing.T, rep benchReport, count int64, items int) {
	t.Helper()
	if rep.Requests != count || rep.Errors != 0 || rep.Checks != count*int64(items) {
		t.Errorf("requests %d, errors %d, checks %d; want %d, 0, %d (first error: %s)",
			rep.Requests, rep.Errors, rep.Checks, count, count*int64(items), rep.FirstError)
	}
	if rep.UnderLimit != rep.Checks || rep.OverLimit != 0 {
		t.Errorf("under %d, over %d; want %d, 0", rep.UnderLimit, rep.OverLimit, rep.Checks)
	}
	if !(0 < rep.P50Ms && rep.P50Ms <= rep.P99Ms && rep.P99Ms <= rep.P999Ms && rep.P999Ms <= rep.MaxMs) {
		t.Errorf("latencies p50 %v, p99 %v, p99.9 %v, max %v ms: want 0 < p50 <= p99 <= p99.9 <= max",
			rep.P50Ms, rep.P99Ms, rep.P999Ms, rep.MaxMs)
	}
	if rep.Seconds <= 0 || rep.RequestsPerSec <= 0 || rep.ChecksPerSec <= 0 {
		t.Errorf("seconds %v, requests/s %v, checks/s %v: want > 0", rep.Seconds, rep.RequestsPerSec, rep.ChecksPerSec)
	}
}

func TestBench(t *testing.T) {
	httpAddr, grpcAddr, stop := startNode(t)
	defer stop()
	for _, tc := range []struct {
		protocol string
		addr     string
		items    int
	}{
		{"grpc", grpcAddr, 1},
		{"grpc", grpcAddr, 10},
		{"http", httpAddr, 1},
		{"http", httpAddr, 10},
	} {
		t.Run(fmt.Sprintf("%s/items=%d", tc.protocol, tc.items), func(t *testing.T) {
			o := benchOpts(tc.protocol, tc.addr)
			o.Items = tc.items
			rep, err := bench(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			checkReport(t, rep, o.Count, o.Items)
		})
	}
}

// TestBenchSeveralAddrs spreads workers over two addresses (of one node).
func TestBenchSeveralAddrs(t *testing.T) {
	httpAddr, _, stop := startNode(t)
	defer stop()
	o := benchOpts("http", httpAddr)
	o.Addrs = []string{httpAddr, httpAddr}
	o.Count = 500
	rep, err := bench(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, o.Count, o.Items)
}

func TestBenchDurationBoundsRun(t *testing.T) {
	_, grpcAddr, stop := startNode(t)
	defer stop()
	o := benchOpts("grpc", grpcAddr)
	o.Count = 1 << 40
	o.Duration = 300 * time.Millisecond
	done := make(chan benchReport, 1)
	go func() {
		rep, err := bench(context.Background(), o)
		if err != nil {
			t.Error(err)
		}
		done <- rep
	}()
	select {
	case rep := <-done:
		if rep.Requests <= 0 || rep.Requests >= o.Count || rep.Errors != 0 {
			t.Errorf("requests %d, errors %d: want some, and no errors (first: %s)", rep.Requests, rep.Errors, rep.FirstError)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("bench with --duration 300ms did not stop")
	}
}

func TestBenchStopsOnCancel(t *testing.T) {
	_, grpcAddr, stop := startNode(t)
	defer stop()
	o := benchOpts("grpc", grpcAddr)
	o.Count = 1 << 40
	o.Duration = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan benchReport, 1)
	go func() {
		rep, err := bench(ctx, o)
		if err != nil {
			t.Error(err)
		}
		done <- rep
	}()
	time.AfterFunc(200*time.Millisecond, cancel)
	select {
	case rep := <-done:
		if rep.Errors != 0 {
			t.Errorf("%d errors after cancel, want 0: requests cut off are left out (first: %s)", rep.Errors, rep.FirstError)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("bench did not stop when its context was cancelled")
	}
}

func TestBenchCommand(t *testing.T) {
	httpAddr, _, stop := startNode(t)
	defer stop()
	var out strings.Builder
	err := run(context.Background(), []string{"bench", "--protocol", "http", "--addr", httpAddr,
		"--count", "300", "--concurrency", "4", "--items", "3", "--json"}, env(nil), &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(out.String()), &got); err != nil {
		t.Fatalf("--json printed %q: %v", out.String(), err)
	}
	for _, k := range []string{"requests", "checks", "errors", "seconds", "requests_per_sec", "checks_per_sec",
		"p50_ms", "p99_ms", "p999_ms", "max_ms", "under_limit", "over_limit"} {
		if _, ok := got[k]; !ok {
			t.Errorf("--json output lacks %q: %s", k, out.String())
		}
	}
	if got["requests"] != 300.0 || got["checks"] != 900.0 {
		t.Errorf("requests %v, checks %v; want 300, 900", got["requests"], got["checks"])
	}

	out.Reset()
	err = run(context.Background(), []string{"bench", "--protocol", "http", "--addr", httpAddr,
		"--count", "50", "--concurrency", "2"}, env(nil), &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"requests", "checks", "errors", "latency p99.9", "under limit"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// TestBenchReportsErrors: a node that refuses every item is measured, and
// its errors are counted and returned, not hidden.
func TestBenchReportsErrors(t *testing.T) {
	_, grpcAddr, stop := startNode(t)
	defer stop()
	o := benchOpts("grpc", grpcAddr)
	o.Count = 20
	o.Algorithm = pb.Algorithm_SLIDING_LOG
	o.Limit = 1 << 62 // above SLIDING_LOG's maximum: every item has an error
	rep, err := bench(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests != 20 || rep.Errors != 20 || rep.FirstError == "" {
		t.Errorf("requests %d, errors %d, first error %q; want 20, 20, the item's error", rep.Requests, rep.Errors, rep.FirstError)
	}
}

func TestBenchFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--items", "1001"}, "--items"},
		{[]string{"--items", "0"}, "--items"},
		{[]string{"--concurrency", "0"}, "--concurrency"},
		{[]string{"--concurrency", "-3"}, "--concurrency"},
		{[]string{"--duration", "0s"}, "--duration"},
		{[]string{"--count", "0"}, "--count"},
		{[]string{"--keys", "0"}, "--keys"},
		{[]string{"--limit", "0"}, "--limit"},
		{[]string{"--protocol", "udp"}, "--protocol"},
		{[]string{"--behavior", "SOMETIMES"}, "--behavior"},
		{[]string{"--algorithm", "DICE"}, "--algorithm"},
	} {
		t.Run(strings.Join(tc.args, "="), func(t *testing.T) {
			// The address is unreachable: validation must fail before any I/O.
			args := append([]string{"bench", "--addr", "127.0.0.1:1"}, tc.args...)
			err := run(context.Background(), args, env(nil), io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.flag) {
				t.Errorf("rlnode %s: error %v, want one naming %s", strings.Join(args, " "), err, tc.flag)
			}
		})
	}
}
