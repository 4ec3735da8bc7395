package main

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// benchJSONKeys are the keys of `rlnode bench --json`, at each level, as
// docs/cli.md documents them: programs that plot runs rely on them.
var benchJSONKeys = map[string][]string{
	"": {"schema", "started", "options", "seconds", "requests", "checks", "answered", "admitted", "refused",
		"errors", "requests_per_sec", "checks_per_sec", "latency_us", "cpu_us_per_check", "nodes", "members", "first_error"},
	"options": {"mode", "protocol", "addrs", "metrics", "metrics_members", "items", "concurrency", "duration_s", "warmup_s", "count", "keys",
		"keys_dist", "zipf_s", "name", "behavior", "algorithm", "limit", "period_ms", "timeout_ms", "tls"},
	"latency_us": {"p50", "p90", "p99", "p999", "max"},
	"nodes[0]":   {"addr", "cpu_seconds", "error"},
}

// checkKeys fails unless object m has exactly the keys want.
func checkKeys(t *testing.T, where string, m map[string]any, want []string) {
	t.Helper()
	got := slices.Sorted(maps.Keys(m))
	if !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("--json %s has keys %v, want %v", where, got, want)
	}
}

// TestBenchCommand: rlnode bench --json against a real node over HTTP, whose
// metrics (the same address, by default) give its CPU per check.
func TestBenchCommand(t *testing.T) {
	httpAddr, _, stop := startNode(t)
	defer stop()
	var out strings.Builder
	err := run(context.Background(), []string{"bench", "--protocol", "http", "--addr", httpAddr,
		"--count", "300", "--concurrency", "4", "--items", "3", "--keys-dist", "zipf", "--zipf-s", "1.5", "--json"},
		env(nil), &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(out.String()), &got); err != nil {
		t.Fatalf("--json printed %q: %v", out.String(), err)
	}
	checkKeys(t, "", got, benchJSONKeys[""])
	opts, _ := got["options"].(map[string]any)
	checkKeys(t, "options", opts, benchJSONKeys["options"])
	lat, _ := got["latency_us"].(map[string]any)
	checkKeys(t, "latency_us", lat, benchJSONKeys["latency_us"])
	nodes, _ := got["nodes"].([]any)
	if len(nodes) != 1 {
		t.Fatalf("nodes %v, want the one node", got["nodes"])
	}
	node, _ := nodes[0].(map[string]any)
	checkKeys(t, "nodes[0]", node, benchJSONKeys["nodes[0]"])

	if got["schema"] != 1.0 || got["requests"] != 300.0 || got["checks"] != 900.0 || got["answered"] != 900.0 || got["members"] != 1.0 {
		t.Errorf("schema %v, requests %v, checks %v, answered %v, members %v; want 1, 300, 900, 900, 1",
			got["schema"], got["requests"], got["checks"], got["answered"], got["members"])
	}
	if opts["mode"] != "rpc" || opts["keys_dist"] != "zipf" || opts["zipf_s"] != 1.5 || opts["items"] != 3.0 ||
		!reflect.DeepEqual(opts["metrics"], []any{httpAddr}) {
		t.Errorf("options %v: want mode rpc, zipf s=1.5, 3 items, metrics [%s]", opts, httpAddr)
	}
	// The node runs in this test process, so its CPU includes the load
	// generator's: enough to show that the figure is read and divided.
	if cpu, ok := got["cpu_us_per_check"].(float64); !ok || cpu <= 0 {
		t.Errorf("cpu_us_per_check %v, want > 0 (node: %v)", got["cpu_us_per_check"], node)
	}
	if s, ok := node["cpu_seconds"].(float64); !ok || s <= 0 || node["addr"] != httpAddr || node["error"] != "" {
		t.Errorf("node %v, want %s with cpu_seconds > 0 and no error", node, httpAddr)
	}

	out.Reset()
	err = run(context.Background(), []string{"bench", "--protocol", "http", "--addr", httpAddr,
		"--count", "50", "--concurrency", "2"}, env(nil), &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"requests", "checks", "answered", "checks/s", "cpu/check", "server CPU of " + httpAddr,
		"errors", "latency p90", "latency p99.9", "admitted", "10000 keys (uniform)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
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
		{[]string{"--keys-dist", "normal"}, "--keys-dist"},
		{[]string{"--keys-dist", "zipf", "--zipf-s", "1"}, "--zipf-s"},
		{[]string{"--keys-dist", "zipf", "--zipf-s", "NaN"}, "--zipf-s"},
		{[]string{"--keys-dist", "zipf", "--zipf-s", "+Inf"}, "--zipf-s"},
		{[]string{"--client", "--protocol", "http"}, "--client"},
		{[]string{"--client", "--items", "2"}, "--items"},
		{[]string{"--route"}, "--route"},
		{[]string{"--metrics", "127.0.0.1:1,,127.0.0.1:2"}, "--metrics"},
		{[]string{"--addrs", "127.0.0.1:1,"}, "--addrs"},
		{[]string{"--metrics-members"}, "--metrics-members"}, // no --metrics to ask
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
