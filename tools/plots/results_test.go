package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// benchJSON is what `rlnode bench --json --protocol grpc --items 1
// --concurrency 1` printed once: 6032.9 checks/s, p99 745.471µs.
func benchJSON(t *testing.T) json.RawMessage {
	t.Helper()
	b, err := os.ReadFile("testdata/bench-grpc.json")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withFigures is raw with its checks_per_sec, p99 and answered replaced.
func withFigures(t *testing.T, raw json.RawMessage, checksPerSec, p99 float64, answered int64) json.RawMessage {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	m["checks_per_sec"] = checksPerSec
	m["latency_us"].(map[string]any)["p99"] = p99
	m["answered"] = answered
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeReport(t *testing.T) {
	rep, err := decodeReport(benchJSON(t))
	if err != nil {
		t.Fatal(err)
	}
	if rep.ChecksPerSec != 6032.891637148422 || rep.LatencyUs.P99 != 745.471 || rep.Answered != 6034 ||
		rep.CPUUsPerCheck == nil || *rep.CPUUsPerCheck != 101.09380178985748 {
		t.Errorf("decodeReport = %+v, want the figures of testdata/bench-grpc.json", rep)
	}
}

func TestSeriesOf(t *testing.T) {
	raw := benchJSON(t)
	runs := []run{ // out of order, as a hand-edited file may be
		{Mode: "redis", Concurrency: 4, Report: withFigures(t, raw, 30000, 400, 90000)},
		{Mode: "grpc", Concurrency: 4, Report: withFigures(t, raw, 12000, 2000, 36000)},
		{Mode: "grpc", Concurrency: 1, Report: raw},
		{Mode: "redis", Concurrency: 1, Report: withFigures(t, raw, 15000, 150, 45000)},
		{Mode: "http", Concurrency: 1, Report: withFigures(t, raw, 0, 0, 0)}, // answered nothing
	}
	got, err := seriesOf(runs)
	if err != nil {
		t.Fatal(err)
	}
	named := func(name string) mode {
		return modes[slices.IndexFunc(modes, func(m mode) bool { return m.Name == name })]
	}
	want := []series{
		{Mode: named("grpc"), Points: []point{{1, 6032.891637148422, 0.745471}, {4, 12000, 2}}},
		{Mode: named("redis"), Points: []point{{1, 15000, 0.15}, {4, 30000, 0.4}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("seriesOf =\n%+v\nwant\n%+v", got, want)
	}
}

// TestSeriesOfMedianOfRounds: a point is the run of median checks/s of
// its rounds (the lower middle of an even number), with that run's p99.
func TestSeriesOfMedianOfRounds(t *testing.T) {
	raw := benchJSON(t)
	runs := []run{
		{Mode: "redis", Concurrency: 1, Round: 0, Report: withFigures(t, raw, 10000, 900, 10000)},
		{Mode: "redis", Concurrency: 1, Round: 1, Report: withFigures(t, raw, 30000, 100, 30000)},
		{Mode: "redis", Concurrency: 1, Round: 2, Report: withFigures(t, raw, 20000, 500, 20000)},
		{Mode: "grpc", Concurrency: 1, Round: 0, Report: withFigures(t, raw, 8000, 300, 8000)},
		{Mode: "grpc", Concurrency: 1, Round: 1, Report: withFigures(t, raw, 6000, 700, 6000)},
	}
	got, err := seriesOf(runs)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Points[0] != (point{1, 6000, 0.7}) || got[1].Points[0] != (point{1, 20000, 0.5}) {
		t.Errorf("seriesOf = %+v, want grpc's 6000/s at p99 0.7 ms and redis's 20000/s at 0.5 ms", got)
	}
}

func TestSeriesOfBadInput(t *testing.T) {
	raw := benchJSON(t)
	schema2 := json.RawMessage(strings.Replace(string(raw), `"schema": 1`, `"schema": 2`, 1))
	for _, tc := range []struct {
		name string
		runs []run
		want string
	}{
		{"unknown mode", []run{{Mode: "memcached", Concurrency: 1, Report: raw}}, `runs[0].mode: unknown mode "memcached"`},
		{"no concurrency", []run{{Mode: "grpc", Report: raw}}, "runs[0].concurrency: 0"},
		{"twice", []run{{Mode: "grpc", Concurrency: 2, Report: raw}, {Mode: "grpc", Concurrency: 2, Report: raw}},
			"runs[1]: a second grpc run at concurrency 2 in round 0"},
		{"other schema", []run{{Mode: "grpc", Concurrency: 1, Report: schema2}}, "runs[0].report: schema: 2, want 1"},
		{"no report", []run{{Mode: "grpc", Concurrency: 1}}, "runs[0].report: "},
		{"not an object", []run{{Mode: "grpc", Concurrency: 1, Report: json.RawMessage(`[1]`)}}, "runs[0].report: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := seriesOf(tc.runs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("seriesOf: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestResultsRoundTrip(t *testing.T) {
	res := results{CPUs: 2, DurationS: 3, Count: 1000, Keys: 10, Runs: []run{{Mode: "grpc", Concurrency: 1, Report: benchJSON(t)}}}
	path := filepath.Join(t.TempDir(), "results.json")
	if err := writeResults(path, res); err != nil {
		t.Fatal(err)
	}
	back, err := readResults(path)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := seriesOf(res.Runs)
	got, err := seriesOf(back.Runs)
	if err != nil || !reflect.DeepEqual(got, want) || back.Keys != res.Keys {
		t.Errorf("read back %+v, %v; want %+v", got, err, want)
	}
}

func TestReadResultsBadFile(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, make([]byte, maxResults+1), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"runs": 3}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{big, bad, filepath.Join(dir, "missing.json")} {
		if _, err := readResults(path); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("readResults(%s): %v, want an error naming the file", path, err)
		}
	}
}
