package loadgen

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/internal/latency"
)

// Schema is the version of Report's JSON form. It changes only
// if a key changes meaning or goes away; new keys may come without it.
const Schema = 1

// Report is what a run measured. `rlnode bench --json` prints it as
// one JSON object, which docs/operations.md documents key by key, for programs
// that compare or plot runs.
type Report struct {
	Schema         int       `json:"schema"`
	Started        time.Time `json:"started"` // UTC
	Options        Setup     `json:"options"`
	Seconds        float64   `json:"seconds"`
	Requests       int64     `json:"requests"` // completed, failed ones included
	Checks         int64     `json:"checks"`   // items in those requests
	Answered       int64     `json:"answered"` // items decided: admitted + refused
	Admitted       int64     `json:"admitted"`
	Refused        int64     `json:"refused"`
	Errors         int64     `json:"errors"` // requests that failed, or had an item that failed
	RequestsPerSec float64   `json:"requests_per_sec"`
	ChecksPerSec   float64   `json:"checks_per_sec"` // answered per second
	LatencyUs      Latency   `json:"latency_us"`     // of a request; of an Allow call with --client
	// CPUUsPerCheck is the CPU the measured nodes used during the run, in
	// µs per answered check; nil (null) when unknown: no --metrics, a node
	// without the figure, or nothing answered.
	CPUUsPerCheck *float64  `json:"cpu_us_per_check"`
	Nodes         []NodeCPU `json:"nodes"`   // one per --metrics address, in order
	Members       int       `json:"members"` // alive members the first node lists; 0 if unknown
	FirstError    string    `json:"first_error"`
}

// Setup is the options of a run, as its report states them.
type Setup struct {
	Mode           string   `json:"mode"` // "rpc": Check requests; "client": client.Allow calls; "client-routed": the same, to owners
	Protocol       string   `json:"protocol"`
	Addrs          []string `json:"addrs"`
	Metrics        []string `json:"metrics"` // the nodes measured: with metrics_members, the members found
	MetricsMembers bool     `json:"metrics_members"`
	Items          int      `json:"items"`
	Concurrency    int      `json:"concurrency"`
	DurationS      float64  `json:"duration_s"`
	WarmupS        float64  `json:"warmup_s"` // the load run unrecorded before the run (--warmup)
	Count          int64    `json:"count"`
	Keys           int      `json:"keys"`
	KeysDist       string   `json:"keys_dist"`
	ZipfS          float64  `json:"zipf_s"` // 0 with uniform keys
	Name           string   `json:"name"`
	Behavior       string   `json:"behavior"`
	Algorithm      string   `json:"algorithm"`
	Limit          int64    `json:"limit"`
	PeriodMs       int64    `json:"period_ms"`
	TimeoutMs      int64    `json:"timeout_ms"`
	TLS            bool     `json:"tls"`
}

// Latency is a run's latency percentiles in µs.
type Latency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

// NodeCPU is the CPU one node used during a run.
type NodeCPU struct {
	Addr       string   `json:"addr"`        // its HTTP address, as in --metrics
	CPUSeconds *float64 `json:"cpu_seconds"` // nil (null) when unknown
	Error      string   `json:"error"`       // why unknown; "" when known
}

func (o Options) setup() Setup {
	s := Setup{
		Mode: "rpc", Protocol: o.Protocol, Addrs: o.Addrs, Metrics: o.Metrics, MetricsMembers: o.MetricsMembers, Items: o.Items,
		Concurrency: o.Concurrency, DurationS: o.Duration.Seconds(), WarmupS: o.Warmup.Seconds(), Count: o.Count, Keys: o.Keys,
		KeysDist: o.KeysDist, Name: o.Name, Behavior: o.Behavior.String(), Algorithm: o.Algorithm.String(),
		Limit: o.Limit, PeriodMs: o.Period.Milliseconds(), TimeoutMs: o.Timeout.Milliseconds(), TLS: o.TLS != nil,
	}
	switch {
	case o.Route:
		s.Mode = "client-routed"
	case o.Client:
		s.Mode = "client"
	}
	if o.KeysDist == "zipf" {
		s.ZipfS = o.ZipfS
	}
	if s.Metrics == nil {
		s.Metrics = []string{} // [], not null, for readers of the JSON
	}
	return s
}

// summarise adds up the workers' results and the nodes' CPU into a report.
func summarise(o Options, started time.Time, elapsed time.Duration, results []workerResult, nodes []NodeCPU, members int) Report {
	rep := Report{
		Schema: Schema, Started: started.UTC(), Options: o.setup(), Seconds: elapsed.Seconds(),
		Nodes: nodes, Members: members,
	}
	var h latency.Histogram
	for i := range results {
		r := &results[i]
		rep.Requests += r.requests.Load()
		rep.Errors += r.errors.Load()
		rep.Admitted += r.under.Load()
		rep.Refused += r.over.Load()
		if rep.FirstError == "" && r.firstErr != nil {
			rep.FirstError = r.firstErr.Error()
		}
		h.Merge(&r.latency)
	}
	rep.Checks = rep.Requests * int64(o.Items)
	rep.Answered = rep.Admitted + rep.Refused
	if rep.Seconds > 0 {
		rep.RequestsPerSec = float64(rep.Requests) / rep.Seconds
		rep.ChecksPerSec = float64(rep.Answered) / rep.Seconds
	}
	µs := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	rep.LatencyUs = Latency{
		P50: µs(h.Quantile(0.50)), P90: µs(h.Quantile(0.90)), P99: µs(h.Quantile(0.99)),
		P999: µs(h.Quantile(0.999)), Max: µs(h.Max()),
	}
	if rep.Nodes == nil {
		rep.Nodes = []NodeCPU{}
	}
	rep.CPUUsPerCheck = cpuPerCheck(rep.Nodes, rep.Answered)
	return rep
}

// cpuPerCheck is the nodes' CPU in µs per answered check, or nil if any
// node's is unknown, there are none, or nothing was answered.
func cpuPerCheck(nodes []NodeCPU, answered int64) *float64 {
	if len(nodes) == 0 || answered == 0 {
		return nil
	}
	var sum float64
	for _, n := range nodes {
		if n.CPUSeconds == nil {
			return nil
		}
		sum += *n.CPUSeconds
	}
	us := sum * 1e6 / float64(answered)
	return &us
}

// Print writes rep as a table a person reads.
func Print(w io.Writer, rep Report) error {
	var b strings.Builder
	o := rep.Options
	what, workers := fmt.Sprintf("%s, %d item(s)/request", o.Protocol, o.Items), "workers"
	switch o.Mode {
	case "client":
		what, workers = "client.Allow over grpc", "goroutines"
	case "client-routed":
		what, workers = "client.Allow over grpc, to each key's owner", "goroutines"
	}
	keys := o.KeysDist
	if keys == "zipf" {
		keys += " s=" + strconv.FormatFloat(o.ZipfS, 'g', -1, 64)
	}
	fmt.Fprintf(&b, "%s to %s: %d %s, %d keys (%s), %s %s %d/%v\n", what, strings.Join(o.Addrs, ","),
		o.Concurrency, workers, o.Keys, keys, o.Behavior, o.Algorithm, o.Limit, time.Duration(o.PeriodMs)*time.Millisecond)
	row := func(label, value, note string) {
		line := fmt.Sprintf("  %-14s %12s  %s", label, value, note)
		b.WriteString(strings.TrimRight(line, " ") + "\n")
	}
	count := func(n int64) string { return strconv.FormatInt(n, 10) }
	us := func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) + "µs" }
	row("requests", count(rep.Requests), fmt.Sprintf("%.0f/s", rep.RequestsPerSec))
	row("checks", count(rep.Checks), "")
	row("answered", count(rep.Answered), fmt.Sprintf("%.0f checks/s", rep.ChecksPerSec))
	if rep.CPUUsPerCheck != nil {
		row("cpu/check", us(*rep.CPUUsPerCheck), cpuNote(rep))
	} else {
		row("cpu/check", "unknown", cpuNote(rep))
	}
	row("admitted", count(rep.Admitted), "")
	row("refused", count(rep.Refused), "")
	row("errors", count(rep.Errors), "")
	row("elapsed", fmt.Sprintf("%.2fs", rep.Seconds), "")
	// Latencies read best in ms from 1ms up; CPU per check stays in µs.
	lat := func(v float64) string {
		if v >= 1000 {
			return strconv.FormatFloat(v/1000, 'f', 2, 64) + "ms"
		}
		return us(v)
	}
	row("latency p50", lat(rep.LatencyUs.P50), "")
	row("latency p90", lat(rep.LatencyUs.P90), "")
	row("latency p99", lat(rep.LatencyUs.P99), "")
	row("latency p99.9", lat(rep.LatencyUs.P999), "")
	row("latency max", lat(rep.LatencyUs.Max), "")
	if rep.FirstError != "" {
		row("first error", "", rep.FirstError)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// cpuNote says whose CPU the cpu/check row counts, or why it is unknown.
func cpuNote(rep Report) string {
	if len(rep.Nodes) == 0 {
		return "(no --metrics: give the nodes' HTTP addresses)"
	}
	var parts []string
	for _, n := range rep.Nodes {
		if n.CPUSeconds == nil {
			parts = append(parts, n.Addr+": "+n.Error)
		} else {
			parts = append(parts, fmt.Sprintf("%s %.2fs", n.Addr, *n.CPUSeconds))
		}
	}
	note := "server CPU of " + strings.Join(parts, ", ")
	if rep.Members > len(rep.Nodes) {
		note += fmt.Sprintf("; only %d of %d alive members measured", len(rep.Nodes), rep.Members)
	}
	return note
}
