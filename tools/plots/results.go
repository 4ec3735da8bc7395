package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"time"
)

// mode is one way of asking for checks: one line on each chart.
type mode struct {
	Name     string // its key in results.json
	Label    string // its name in the charts' legends
	Protocol string // rlnode bench --protocol; "" for the loads this program drives over the Redis protocol
	RESP     bool   // with no Protocol: CL.THROTTLE on the node's RESP port; else Redis
	Client   bool   // rlnode bench --client: the Go client's Allow, which batches concurrent calls
	Lease    bool   // rlnode bench --lease: the Go client decides from grants (docs/leases.md)
	Before   bool   // rlnode bench from the -before build, against the same node: the client before a change
	Keys     int    // the keys the run draws from; 0 means -keys
}

// modes are the lines of the charts, in legend order. Each checks one key
// a call. The leased client runs on a few hot keys, the load leases are
// for (a lease of each of 10,000 keys checked a few times a second costs
// a call a check: docs/leases.md, when to lease), and Redis runs on the
// same keys beside it.
var modes = []mode{
	{Name: "client", Label: "ringlimit, Go client Allow (batching)", Protocol: "grpc", Client: true},
	{Name: "client-before", Label: "ringlimit, Go client Allow (batching), the -before build", Protocol: "grpc", Client: true, Before: true},
	{Name: "grpc", Label: "ringlimit, gRPC, 1 check a request", Protocol: "grpc"},
	{Name: "http", Label: "ringlimit, HTTP/JSON, 1 check a request", Protocol: "http"},
	{Name: "resp", Label: "ringlimit, RESP CL.THROTTLE (go-redis), 1 check a request", RESP: true},
	{Name: "redis", Label: "Redis + Lua (go-redis/redis_rate)"},
	{Name: "lease", Label: "ringlimit, Go client Allow, leased (10 hot keys)", Protocol: "grpc", Client: true, Lease: true, Keys: 10},
	{Name: "redis-hot", Label: "Redis + Lua (10 hot keys)", Keys: 10},
}

// reportSchema is the version of `rlnode bench --json` this program reads.
const reportSchema = 1

// report is the part of `rlnode bench --json` (schema 1, keys as
// docs/operations.md documents them) that the charts and the progress
// lines use.
// The Redis load fills in the same keys with the same meanings.
type report struct {
	Schema       int       `json:"schema"`
	Seconds      float64   `json:"seconds"`
	Requests     int64     `json:"requests"` // calls, failed ones included
	Answered     int64     `json:"answered"` // checks admitted or refused
	Admitted     int64     `json:"admitted"`
	Refused      int64     `json:"refused"`
	Errors       int64     `json:"errors"`
	ChecksPerSec float64   `json:"checks_per_sec"` // answered per second
	LatencyUs    latencyUs `json:"latency_us"`     // of a call
	// CPUUsPerCheck is the server's CPU in µs per answered check; nil
	// when unknown.
	CPUUsPerCheck *float64 `json:"cpu_us_per_check"`
	FirstError    string   `json:"first_error"`
}

// latencyUs is a run's latency percentiles in µs.
type latencyUs struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

// decodeReport reads one run's report and checks its schema.
func decodeReport(raw []byte) (report, error) {
	var r report
	if err := json.Unmarshal(raw, &r); err != nil {
		return report{}, err
	}
	if r.Schema != reportSchema {
		return report{}, fmt.Errorf("schema: %d, want %d", r.Schema, reportSchema)
	}
	return r, nil
}

// results is what results.json holds: how the runs were made, and each
// run's report as it came (rlnode bench's JSON verbatim; the Redis
// load's in the same keys).
type results struct {
	Started   time.Time `json:"started"`          // UTC
	Go        string    `json:"go"`               // the Go version this program was built with
	CPUs      int       `json:"cpus"`             // of the machine, which servers and load shared
	DurationS float64   `json:"duration_s"`       // each run's longest
	Rounds    int       `json:"rounds,omitempty"` // runs of each mode at each level (0: 1)
	Count     int64     `json:"count"`
	Keys      int       `json:"keys"`
	Runs      []run     `json:"runs"`
}

// run is one mode at one concurrency, in one round.
type run struct {
	Mode        string          `json:"mode"` // a mode's Name
	Concurrency int             `json:"concurrency"`
	Round       int             `json:"round,omitempty"` // from 0
	Report      json.RawMessage `json:"report"`
}

// series is one mode's points, by ascending concurrency.
type series struct {
	Mode   mode
	Points []point
}

// point is what the charts show of one run.
type point struct {
	Concurrency  int
	ChecksPerSec float64
	P99Ms        float64
}

// seriesOf sorts runs into one series a mode, in the order of modes,
// leaving out the modes without runs. Of the rounds of a mode at a level,
// the point is the run of median checks/s (the lower of two middles),
// with that run's p99: one noisy run, on a shared machine, moves no
// point. A run that answered nothing has no latency or rate to draw and
// is left out too.
func seriesOf(runs []run) ([]series, error) {
	type at struct {
		mode        string
		concurrency int
	}
	rounds := map[at][]int{}
	byPoint := map[at][]point{}
	for i, r := range runs {
		if !slices.ContainsFunc(modes, func(m mode) bool { return m.Name == r.Mode }) {
			return nil, fmt.Errorf("runs[%d].mode: unknown mode %q", i, r.Mode)
		}
		if r.Concurrency < 1 {
			return nil, fmt.Errorf("runs[%d].concurrency: %d, want > 0", i, r.Concurrency)
		}
		k := at{r.Mode, r.Concurrency}
		if slices.Contains(rounds[k], r.Round) {
			return nil, fmt.Errorf("runs[%d]: a second %s run at concurrency %d in round %d", i, r.Mode, r.Concurrency, r.Round)
		}
		rounds[k] = append(rounds[k], r.Round)
		rep, err := decodeReport(r.Report)
		if err != nil {
			return nil, fmt.Errorf("runs[%d].report: %w", i, err)
		}
		if rep.Answered == 0 {
			continue
		}
		byPoint[k] = append(byPoint[k], point{
			Concurrency: r.Concurrency, ChecksPerSec: rep.ChecksPerSec, P99Ms: rep.LatencyUs.P99 / 1000,
		})
	}
	byMode := map[string][]point{}
	for k, ps := range byPoint {
		slices.SortFunc(ps, func(a, b point) int { return cmp.Compare(a.ChecksPerSec, b.ChecksPerSec) })
		byMode[k.mode] = append(byMode[k.mode], ps[(len(ps)-1)/2])
	}
	var out []series
	for _, m := range modes {
		ps := byMode[m.Name]
		if len(ps) == 0 {
			continue
		}
		slices.SortFunc(ps, func(a, b point) int { return a.Concurrency - b.Concurrency })
		out = append(out, series{Mode: m, Points: ps})
	}
	return out, nil
}

// maxResults bounds the size of a results.json that -from reads.
const maxResults = 16 << 20

// readResults reads a results.json.
func readResults(path string) (results, error) {
	f, err := os.Open(path)
	if err != nil {
		return results{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxResults+1))
	if err != nil {
		return results{}, err
	}
	if len(b) > maxResults {
		return results{}, fmt.Errorf("%s: larger than %d bytes", path, maxResults)
	}
	var res results
	if err := json.Unmarshal(b, &res); err != nil {
		return results{}, fmt.Errorf("%s: %w", path, err)
	}
	return res, nil
}

// writeResults writes res to path as indented JSON.
func writeResults(path string, res results) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
