package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/internal/latency"
	"github.com/ringlimit/ringlimit/service"
)

// benchOptions says what `rlnode bench` sends, where, and for how long.
type benchOptions struct {
	Addrs       []string // nodes; worker i talks to Addrs[i%len(Addrs)]
	Protocol    string   // "grpc" or "http"
	Items       int      // items per request, 1..service.MaxItems
	Concurrency int      // workers, each with one request in flight
	Duration    time.Duration
	Count       int64 // requests in total; the run stops at Count or Duration, whichever comes first
	Keys        int   // distinct keys bench:0 .. bench:<Keys-1>
	Name        string
	Behavior    pb.Behavior
	Algorithm   pb.Algorithm
	Limit       int64
	Period      time.Duration
	Timeout     time.Duration // per request
	TLS         *client.TLS   // nil: plaintext
}

// validate reports the first invalid option, naming its flag.
func (o benchOptions) validate() error {
	switch {
	case len(o.Addrs) == 0:
		return errors.New("--addr: no address")
	case o.Protocol != "grpc" && o.Protocol != "http":
		return fmt.Errorf("--protocol: %q, want grpc or http", o.Protocol)
	case o.Items < 1 || o.Items > service.MaxItems:
		return fmt.Errorf("--items: %d, want 1 to %d", o.Items, service.MaxItems)
	case o.Concurrency <= 0:
		return fmt.Errorf("--concurrency: %d, want > 0", o.Concurrency)
	case o.Duration <= 0:
		return fmt.Errorf("--duration: %v, want > 0", o.Duration)
	case o.Count <= 0:
		return fmt.Errorf("--count: %d, want > 0", o.Count)
	case o.Keys <= 0:
		return fmt.Errorf("--keys: %d, want > 0", o.Keys)
	case o.Limit <= 0:
		return fmt.Errorf("--limit: %d, want > 0", o.Limit)
	case o.Period < time.Millisecond:
		return fmt.Errorf("--period: %v, want at least 1ms", o.Period)
	case o.Timeout <= 0:
		return fmt.Errorf("--timeout: %v, want > 0", o.Timeout)
	}
	for _, a := range o.Addrs {
		if a == "" {
			return errors.New("--addrs: empty address")
		}
	}
	return nil
}

// benchReport is what a run measured. Its JSON keys are stable.
type benchReport struct {
	Requests       int64   `json:"requests"` // completed, failed ones included
	Checks         int64   `json:"checks"`   // items in those requests
	Errors         int64   `json:"errors"`   // requests that failed, or had an item with an error
	Seconds        float64 `json:"seconds"`
	RequestsPerSec float64 `json:"requests_per_sec"`
	ChecksPerSec   float64 `json:"checks_per_sec"`
	P50Ms          float64 `json:"p50_ms"`
	P99Ms          float64 `json:"p99_ms"`
	P999Ms         float64 `json:"p999_ms"`
	MaxMs          float64 `json:"max_ms"`
	UnderLimit     int64   `json:"under_limit"` // items admitted
	OverLimit      int64   `json:"over_limit"`  // items refused
	FirstError     string  `json:"first_error,omitempty"`
}

// runBench is `rlnode bench`: a bounded load generator against one or
// more nodes, reporting throughput and latency.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rlnode bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	withUsage(fs, `Usage: rlnode bench [--addr HOST:PORT | --addrs A,B,C] [flags]

A bounded load generator: --concurrency workers send checks over --protocol
until --count requests or --duration, whichever comes first, then it
prints requests and checks per second and latency percentiles. It exits 2
if any request or check failed.

Flags:
`)
	addr := fs.String("addr", "", "address of a node (default localhost:8081 for grpc, localhost:8080 for http)")
	addrs := fs.String("addrs", "", "comma-separated node addresses; workers are spread over them round-robin (overrides --addr)")
	protocol := fs.String("protocol", "grpc", "grpc or http")
	items := fs.Int("items", 1, fmt.Sprintf("items per request (1 to %d)", service.MaxItems))
	concurrency := fs.Int("concurrency", 64, "workers, each with one request in flight")
	duration := fs.Duration("duration", 10*time.Second, "stop after this long")
	count := fs.Int64("count", 1_000_000, "stop after this many requests in total")
	keys := fs.Int("keys", 10_000, "distinct keys, bench:0 .. bench:<keys-1>")
	name := fs.String("name", "bench", "limit name")
	behavior := fs.String("behavior", "BATCHED", "BATCHED, UNBATCHED, GLOBAL or LOCAL")
	algorithm := fs.String("algorithm", "TOKEN_BUCKET", "TOKEN_BUCKET, GCRA, LEAKY_BUCKET, FIXED_WINDOW, SLIDING_WINDOW or SLIDING_LOG")
	limit := fs.Int64("limit", 1_000_000, "requests allowed per --period (high, so the load measures the path, not refusals)")
	period := fs.Duration("period", time.Second, "the limit's period")
	timeout := fs.Duration("timeout", 5*time.Second, "give up on one request after this long")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	tlsFlags := addClientTLS(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected argument %q", fs.Arg(0))
	}
	opts := benchOptions{
		Protocol: *protocol, Items: *items, Concurrency: *concurrency, Duration: *duration,
		Count: *count, Keys: *keys, Name: *name, Limit: *limit, Period: *period, Timeout: *timeout,
		TLS: tlsFlags.config(),
	}
	switch {
	case *addrs != "":
		for a := range strings.SplitSeq(*addrs, ",") {
			opts.Addrs = append(opts.Addrs, strings.TrimSpace(a))
		}
	case *addr != "":
		opts.Addrs = []string{*addr}
	case *protocol == "http":
		opts.Addrs = []string{"localhost:8080"}
	default:
		opts.Addrs = []string{"localhost:8081"}
	}
	b, ok := pb.Behavior_value[strings.ToUpper(*behavior)]
	if !ok {
		return fmt.Errorf("--behavior: unknown behavior %q (want BATCHED, UNBATCHED, GLOBAL or LOCAL)", *behavior)
	}
	opts.Behavior = pb.Behavior(b)
	alg, err := algorithms.ParseKind(*algorithm)
	if err != nil {
		return fmt.Errorf("--algorithm: %w", err)
	}
	opts.Algorithm = pb.Algorithm(alg)

	rep, err := bench(ctx, opts)
	if err != nil {
		return err
	}
	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(rep); err != nil {
			return err
		}
	} else if err := printBench(stdout, opts, rep); err != nil {
		return err
	}
	if rep.Errors > 0 {
		return fmt.Errorf("bench: %d of %d requests failed; first: %s", rep.Errors, rep.Requests, rep.FirstError)
	}
	return nil
}

// printBench writes rep as a table a person reads.
func printBench(w io.Writer, o benchOptions, rep benchReport) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s to %s: %d workers, %d item(s)/request, %d keys, %s %s %d/%v\n",
		o.Protocol, strings.Join(o.Addrs, ","), o.Concurrency, o.Items, o.Keys, o.Behavior, o.Algorithm, o.Limit, o.Period)
	row := func(label, value, rate string) {
		line := fmt.Sprintf("  %-14s %12s  %s", label, value, rate)
		b.WriteString(strings.TrimRight(line, " ") + "\n")
	}
	row("requests", strconv.FormatInt(rep.Requests, 10), fmt.Sprintf("%.0f/s", rep.RequestsPerSec))
	row("checks", strconv.FormatInt(rep.Checks, 10), fmt.Sprintf("%.0f/s", rep.ChecksPerSec))
	row("errors", strconv.FormatInt(rep.Errors, 10), "")
	row("elapsed", fmt.Sprintf("%.2fs", rep.Seconds), "")
	row("under limit", strconv.FormatInt(rep.UnderLimit, 10), "")
	row("over limit", strconv.FormatInt(rep.OverLimit, 10), "")
	row("latency p50", fmt.Sprintf("%.3fms", rep.P50Ms), "")
	row("latency p99", fmt.Sprintf("%.3fms", rep.P99Ms), "")
	row("latency p99.9", fmt.Sprintf("%.3fms", rep.P999Ms), "")
	row("latency max", fmt.Sprintf("%.3fms", rep.MaxMs), "")
	if rep.FirstError != "" {
		row("first error", "", rep.FirstError)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// checker sends one request of the worker's items and returns how many
// were admitted and refused. An error means the request, or one of its
// items, failed.
type checker interface {
	check(ctx context.Context, keys []int) (under, over int64, err error)
}

// bench runs opts.Concurrency workers until opts.Count requests have been
// sent in total, opts.Duration has passed, or ctx is cancelled, and
// reports what they measured. Requests in flight when the duration ends
// are allowed to finish; those cut off by ctx are left out of the report.
func bench(ctx context.Context, o benchOptions) (benchReport, error) {
	if err := o.validate(); err != nil {
		return benchReport{}, err
	}
	checkers := make([]checker, len(o.Addrs))
	switch o.Protocol {
	case "grpc":
		for i, a := range o.Addrs {
			opts, err := dialOptions(o.TLS, a)
			if err != nil {
				return benchReport{}, err
			}
			c, err := client.New(a, opts...)
			if err != nil {
				return benchReport{}, err
			}
			defer c.Close()
			checkers[i] = &grpcChecker{c: c, o: o}
		}
	case "http":
		base := http.DefaultTransport.(*http.Transport).Clone()
		base.MaxIdleConns = o.Concurrency + len(o.Addrs)
		base.MaxIdleConnsPerHost = o.Concurrency
		for i, a := range o.Addrs {
			// A transport per node: each verifies its own node's name.
			url, tr, err := httpBase(o.TLS, a, base)
			if err != nil {
				return benchReport{}, err
			}
			defer tr.CloseIdleConnections()
			checkers[i] = &httpChecker{hc: &http.Client{Transport: tr}, url: url + "/v1/check", o: o}
		}
	}

	var issued atomic.Int64
	deadline := time.Now().Add(o.Duration)
	results := make([]workerResult, o.Concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range o.Concurrency {
		wg.Go(func() {
			results[w] = runWorker(ctx, o, checkers[w%len(checkers)], uint64(w), deadline, &issued)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	var rep benchReport
	var h latency.Histogram
	for i := range results {
		r := &results[i]
		rep.Requests += r.requests
		rep.Errors += r.errors
		rep.UnderLimit += r.under
		rep.OverLimit += r.over
		if rep.FirstError == "" && r.firstErr != nil {
			rep.FirstError = r.firstErr.Error()
		}
		h.Merge(&r.latency)
	}
	rep.Checks = rep.Requests * int64(o.Items)
	rep.Seconds = elapsed.Seconds()
	if rep.Seconds > 0 {
		rep.RequestsPerSec = float64(rep.Requests) / rep.Seconds
		rep.ChecksPerSec = float64(rep.Checks) / rep.Seconds
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	rep.P50Ms = ms(h.Quantile(0.50))
	rep.P99Ms = ms(h.Quantile(0.99))
	rep.P999Ms = ms(h.Quantile(0.999))
	rep.MaxMs = ms(h.Max())
	return rep, nil
}

// workerResult is one worker's tally; only that worker writes it.
type workerResult struct {
	requests, errors, under, over int64
	firstErr                      error
	latency                       latency.Histogram
}

// runWorker sends requests one after another until the shared count is
// spent, the deadline passes or ctx is cancelled. Its keys come from a PCG
// seeded by the worker's id, so runs are repeatable.
func runWorker(ctx context.Context, o benchOptions, c checker, id uint64, deadline time.Time, issued *atomic.Int64) workerResult {
	var res workerResult
	rng := rand.New(rand.NewPCG(id, 0x72696e676c696d74))
	keys := make([]int, o.Items)
	for ctx.Err() == nil && time.Now().Before(deadline) && issued.Add(1) <= o.Count {
		for i := range keys {
			keys[i] = rng.IntN(o.Keys)
		}
		rctx, cancel := context.WithTimeout(ctx, o.Timeout)
		t0 := time.Now()
		under, over, err := c.check(rctx, keys)
		took := time.Since(t0)
		cancel()
		if err != nil && ctx.Err() != nil {
			break // cut off by the caller, not a failure of the node
		}
		res.requests++
		res.latency.Record(took)
		res.under += under
		res.over += over
		if err != nil {
			res.errors++
			if res.firstErr == nil {
				res.firstErr = err
			}
		}
	}
	return res
}

// grpcChecker sends requests over one shared gRPC connection per node.
type grpcChecker struct {
	c *client.Client
	o benchOptions
}

func (g *grpcChecker) check(ctx context.Context, keys []int) (under, over int64, err error) {
	req := &pb.CheckRequest{Requests: make([]*pb.CheckItem, len(keys))}
	for i, k := range keys {
		req.Requests[i] = &pb.CheckItem{
			Name: g.o.Name, Key: "bench:" + strconv.Itoa(k), Limit: g.o.Limit,
			DurationMs: g.o.Period.Milliseconds(), Algorithm: g.o.Algorithm, Behavior: g.o.Behavior,
		}
	}
	resp, err := g.c.Check(ctx, req)
	if err != nil {
		return 0, 0, err
	}
	if len(resp.Responses) != len(keys) {
		return 0, 0, fmt.Errorf("%d results for %d items", len(resp.Responses), len(keys))
	}
	for _, r := range resp.Responses {
		if r.Error != "" && err == nil {
			err = fmt.Errorf("item: %s", r.Error)
		}
		if r.Status == pb.Status_UNDER_LIMIT {
			under++
		} else {
			over++
		}
	}
	return under, over, err
}

// httpChecker sends requests as POST /v1/check through a shared client.
type httpChecker struct {
	hc  *http.Client
	url string
	o   benchOptions
}

func (h *httpChecker) check(ctx context.Context, keys []int) (under, over int64, err error) {
	body := make([]byte, 0, 64+len(keys)*(128+len(h.o.Name)))
	body = append(body, `{"requests":[`...)
	for i, k := range keys {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, `{"name":`...)
		body = strconv.AppendQuote(body, h.o.Name)
		body = append(body, `,"key":"bench:`...)
		body = strconv.AppendInt(body, int64(k), 10)
		body = append(body, `","limit":`...)
		body = strconv.AppendInt(body, h.o.Limit, 10)
		body = append(body, `,"duration_ms":`...)
		body = strconv.AppendInt(body, h.o.Period.Milliseconds(), 10)
		body = append(body, `,"algorithm":"`...)
		body = append(body, h.o.Algorithm.String()...)
		body = append(body, `","behavior":"`...)
		body = append(body, h.o.Behavior.String()...)
		body = append(body, `"}`...)
	}
	body = append(body, `]}`...)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.hc.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(data))
	}
	var out struct {
		Responses []struct {
			Status string `json:"status"`
			Error  string `json:"error"`
		} `json:"responses"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return 0, 0, fmt.Errorf("response: %w", err)
	}
	if len(out.Responses) != len(keys) {
		return 0, 0, fmt.Errorf("%d results for %d items", len(out.Responses), len(keys))
	}
	for _, r := range out.Responses {
		if r.Error != "" && err == nil {
			err = fmt.Errorf("item: %s", r.Error)
		}
		if r.Status == "UNDER_LIMIT" {
			under++
		} else {
			over++
		}
	}
	return under, over, err
}
