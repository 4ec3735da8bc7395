package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/cluster"
	"github.com/ringlimit/ringlimit/internal/latency"
	"github.com/ringlimit/ringlimit/service"
)

// benchOptions says what `rlnode bench` sends, where, and for how long.
type benchOptions struct {
	Addrs       []string // nodes; worker i talks to Addrs[i%len(Addrs)]
	Protocol    string   // "grpc" or "http"
	Client      bool     // call client.Allow, one item a call, instead of sending Check requests
	Route       bool     // with Client: one client over all Addrs, sending each check to its key's owner
	Lease       bool     // with Client: the limit is leased, its checks decided in the client from grants
	Items       int      // items per request, 1..service.MaxItems
	Concurrency int      // workers, each with one request in flight
	Duration    time.Duration
	Count       int64    // requests in total; the run stops at Count or Duration, whichever comes first
	Keys        int      // distinct keys bench:0 .. bench:<Keys-1>
	KeysDist    string   // "uniform", or "zipf": bench:0 the most frequent
	ZipfS       float64  // the Zipf exponent s > 1, with KeysDist "zipf"
	Metrics     []string // HTTP addresses of the nodes whose CPU is measured; none: unknown
	// MetricsMembers replaces Metrics, before the run, with the HTTP
	// addresses of the alive members that Metrics[0] lists.
	MetricsMembers bool
	Name           string
	Behavior       pb.Behavior
	Algorithm      pb.Algorithm
	Limit          int64
	Period         time.Duration
	Timeout        time.Duration // per request, and per read of a node's metrics
	TLS            *client.TLS   // nil: plaintext

	// Progress, if not nil, is where the run reports its progress as it
	// goes, as showProgress does; TTY says whether it is a terminal.
	Progress io.Writer
	TTY      bool
}

// validate reports the first invalid option, naming its flag.
func (o benchOptions) validate() error {
	switch {
	case len(o.Addrs) == 0:
		return errors.New("--addr: no address")
	case o.Protocol != "grpc" && o.Protocol != "http":
		return fmt.Errorf("--protocol: %q, want grpc or http", o.Protocol)
	case o.Client && o.Protocol != "grpc":
		return fmt.Errorf("--client: the Go client speaks grpc, not --protocol %s", o.Protocol)
	case o.Items < 1 || o.Items > service.MaxItems:
		return fmt.Errorf("--items: %d, want 1 to %d", o.Items, service.MaxItems)
	case o.Lease && !o.Client:
		return errors.New("--lease: leases are the Go client's; add --client")
	case o.Route && !o.Client:
		return errors.New("--route: routes the Go client's checks; add --client")
	case o.Client && o.Items != 1:
		return fmt.Errorf("--items: %d, want 1 with --client, which checks one item per Allow call", o.Items)
	case o.Concurrency <= 0:
		return fmt.Errorf("--concurrency: %d, want > 0", o.Concurrency)
	case o.Duration <= 0:
		return fmt.Errorf("--duration: %v, want > 0", o.Duration)
	case o.Count <= 0:
		return fmt.Errorf("--count: %d, want > 0", o.Count)
	case o.Keys <= 0:
		return fmt.Errorf("--keys: %d, want > 0", o.Keys)
	case o.KeysDist != "uniform" && o.KeysDist != "zipf":
		return fmt.Errorf("--keys-dist: %q, want uniform or zipf", o.KeysDist)
	case o.KeysDist == "zipf" && !(o.ZipfS > 1 && !math.IsInf(o.ZipfS, 1)):
		return fmt.Errorf("--zipf-s: %v, want a number > 1", o.ZipfS)
	case o.Limit <= 0:
		return fmt.Errorf("--limit: %d, want > 0", o.Limit)
	case o.Period < time.Millisecond:
		return fmt.Errorf("--period: %v, want at least 1ms", o.Period)
	case o.Timeout <= 0:
		return fmt.Errorf("--timeout: %v, want > 0", o.Timeout)
	case slices.Contains(o.Addrs, ""):
		return errors.New("--addrs: empty address")
	case slices.Contains(o.Metrics, ""):
		return errors.New("--metrics: empty address")
	case o.MetricsMembers && len(o.Metrics) == 0:
		return errors.New("--metrics-members: no node to ask for its members; name one with --metrics")
	}
	return nil
}

// limit is the limit every check of the run asks for.
func (o benchOptions) limit() client.Limit {
	return client.Limit{Name: o.Name, Count: o.Limit, Period: o.Period, Algorithm: o.Algorithm, Behavior: o.Behavior, Lease: o.Lease}
}

// runBench is `rlnode bench`: a bounded load generator against one or
// more nodes, reporting throughput, latency and the nodes' CPU per check.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rlnode bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	withUsage(fs, `Usage: rlnode bench [--addr HOST:PORT | --addrs A,B,C] [--metrics H1,H2] [flags]

A bounded load generator: --concurrency workers send checks over --protocol
until --count requests or --duration, whichever comes first, then it
prints checks per second, latency percentiles (p50, p90, p99, p99.9), and
the server CPU that a check cost. It exits 2 if any request or check failed.

Server CPU: before and after the run, bench reads process_cpu_seconds_total
from GET /metrics at each HTTP address in --metrics, and divides the sum of
the increases by the checks answered. List every node of a cluster (a
forwarded check costs CPU on two), or name one and add --metrics-members:
bench then measures every alive member that node lists in GET /v1/members,
at the HTTP address each member gossips. Otherwise bench asks the first for
/v1/members and warns if it lists more alive members than were measured.
--metrics defaults to the target addresses with --protocol http, to
localhost:8080 when no address is given, and is otherwise empty. Where a
node serves no such metric, CPU is unknown.

--client drives the load through the Go client's Allow, one check a call,
from --concurrency goroutines, as an application does, instead of Check
requests of --items items.

Keys are bench:0 .. bench:<keys-1>, drawn uniformly, or with --keys-dist
zipf from a Zipf distribution (bench:0 the hottest; a larger --zipf-s is
more skewed).

Progress goes to stderr: on a terminal, one line updated every second;
otherwise a line every 10s. --json prints one JSON object (see the README).

Flags:
`)
	addr := fs.String("addr", "", "address of a node (default localhost:8081 for grpc, localhost:8080 for http)")
	addrs := fs.String("addrs", "", "comma-separated node addresses; workers are spread over them round-robin (overrides --addr)")
	protocol := fs.String("protocol", "grpc", "grpc or http")
	useClient := fs.Bool("client", false, "call the Go client's Allow, one check a call, instead of sending Check requests (grpc only)")
	lease := fs.Bool("lease", false, "with --client: lease the limit, so that the client decides its checks from grants the keys' owners lend it (docs/leases.md)")
	route := fs.Bool("route", false, "with --client: one client that learns the cluster's ring through the addresses and sends each check straight to its key's owner")
	metrics := fs.String("metrics", "", "comma-separated HTTP addresses of the nodes whose CPU is measured (default: see above)")
	metricsMembers := fs.Bool("metrics-members", false, "measure every alive member the first --metrics node lists, instead of the --metrics list")
	items := fs.Int("items", 1, fmt.Sprintf("items per request (1 to %d)", service.MaxItems))
	concurrency := fs.Int("concurrency", 64, "workers, each with one request in flight")
	duration := fs.Duration("duration", 10*time.Second, "stop after this long")
	count := fs.Int64("count", 1_000_000, "stop after this many requests in total")
	keys := fs.Int("keys", 10_000, "distinct keys, bench:0 .. bench:<keys-1>")
	keysDist := fs.String("keys-dist", "uniform", "how keys are drawn: uniform or zipf")
	zipfS := fs.Float64("zipf-s", 1.1, "the Zipf exponent s > 1 with --keys-dist zipf: key k is drawn in proportion to (k+1)^-s")
	name := fs.String("name", "bench", "limit name")
	behavior := fs.String("behavior", "BATCHED", "BATCHED, UNBATCHED, GLOBAL or LOCAL")
	algorithm := fs.String("algorithm", "TOKEN_BUCKET", "TOKEN_BUCKET, GCRA, LEAKY_BUCKET, FIXED_WINDOW, SLIDING_WINDOW or SLIDING_LOG")
	limit := fs.Int64("limit", 1_000_000, "requests allowed per --period (high, so the load measures the path, not refusals)")
	period := fs.Duration("period", time.Second, "the limit's period")
	timeout := fs.Duration("timeout", 5*time.Second, "give up on one request, or one read of a node's metrics, after this long")
	asJSON := fs.Bool("json", false, "print the result as one JSON object")
	tlsFlags := addClientTLS(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected argument %q", fs.Arg(0))
	}
	opts := benchOptions{
		Protocol: *protocol, Client: *useClient, Route: *route, Lease: *lease, Items: *items, Concurrency: *concurrency, Duration: *duration,
		Count: *count, Keys: *keys, KeysDist: *keysDist, ZipfS: *zipfS, Name: *name, Limit: *limit,
		Period: *period, Timeout: *timeout, TLS: tlsFlags.config(), Progress: stderr, TTY: isTerminal(stderr),
		MetricsMembers: *metricsMembers,
	}
	switch {
	case *addrs != "":
		opts.Addrs = splitList(*addrs)
	case *addr != "":
		opts.Addrs = []string{*addr}
	case *protocol == "http":
		opts.Addrs = []string{"localhost:8080"}
	default:
		opts.Addrs = []string{"localhost:8081"}
	}
	switch {
	case *metrics != "":
		opts.Metrics = splitList(*metrics)
	case *protocol == "http":
		opts.Metrics = opts.Addrs
	case *addrs == "" && *addr == "":
		opts.Metrics = []string{"localhost:8080"} // the node on the default ports
	}
	opts.Metrics = distinct(opts.Metrics) // a node listed twice would count twice
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
	if rep.Members > len(rep.Nodes) {
		fmt.Fprintf(stderr, "rlnode bench: --metrics measured %d node(s), but %s lists %d alive members: cpu/check leaves the others out\n",
			len(rep.Nodes), rep.Nodes[0].Addr, rep.Members)
	}
	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(rep); err != nil {
			return err
		}
	} else if err := printBench(stdout, rep); err != nil {
		return err
	}
	if rep.Errors > 0 {
		return fmt.Errorf("bench: %d of %d requests failed; first: %s", rep.Errors, rep.Requests, rep.FirstError)
	}
	return nil
}

// splitList splits a comma-separated flag value, trimming spaces.
func splitList(s string) []string {
	var out []string
	for a := range strings.SplitSeq(s, ",") {
		out = append(out, strings.TrimSpace(a))
	}
	return out
}

// distinct returns list without its repeats, in order.
func distinct(list []string) []string {
	var out []string
	for _, a := range list {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// bench runs opts.Concurrency workers until opts.Count requests have been
// sent in total, opts.Duration has passed, or ctx is cancelled, and
// reports what they measured. Requests in flight when the duration ends
// are allowed to finish; those cut off by ctx are left out of the report.
// A node in opts.Metrics that cannot be read before the run is an error.
func bench(ctx context.Context, o benchOptions) (benchReport, error) {
	if err := o.validate(); err != nil {
		return benchReport{}, err
	}
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	checkers, err := newCheckers(o, &closers)
	if err != nil {
		return benchReport{}, err
	}
	if o.MetricsMembers {
		if o.Metrics, err = memberMetrics(ctx, o); err != nil {
			return benchReport{}, err
		}
	}
	meter, err := newCPUMeter(o, &closers)
	if err != nil {
		return benchReport{}, err
	}
	members, err := meter.start(ctx)
	if err != nil {
		return benchReport{}, err
	}

	var issued atomic.Int64
	results := make([]workerResult, o.Concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(o.Duration)
	for w := range o.Concurrency {
		wg.Go(func() {
			runWorker(ctx, o, checkers[w%len(checkers)], uint64(w), deadline, &issued, &results[w])
		})
	}
	done := make(chan struct{})
	var shown sync.WaitGroup
	if o.Progress != nil {
		shown.Go(func() { showProgress(o.Progress, o.TTY, start, done, func() tally { return sum(results) }) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(done)
	shown.Wait()
	return summarise(o, start, elapsed, results, meter.stop(ctx), members), nil
}

// newCheckers returns a checker per address in o.Addrs, and adds to
// closers what releases them.
func newCheckers(o benchOptions, closers *[]func()) ([]checker, error) {
	checkers := make([]checker, len(o.Addrs))
	switch {
	case o.Route:
		opts, err := dialOptions(o.TLS, o.Addrs[0])
		if err != nil {
			return nil, err
		}
		copts := []client.Option{client.WithCluster()}
		if opts != nil {
			copts = append(copts, client.WithDialOptions(opts...))
		}
		c, err := client.Open(o.Addrs, copts...)
		if err != nil {
			return nil, err
		}
		*closers = append(*closers, func() { c.Close() })
		for i := range checkers {
			checkers[i] = allowChecker{c: c, l: o.limit()}
		}
	case o.Protocol == "grpc":
		for i, a := range o.Addrs {
			opts, err := dialOptions(o.TLS, a)
			if err != nil {
				return nil, err
			}
			if o.Client {
				c, err := client.New(a, opts...)
				if err != nil {
					return nil, err
				}
				*closers = append(*closers, func() { c.Close() })
				checkers[i] = allowChecker{c: c, l: o.limit()}
				continue
			}
			// Raw requests go on a bare connection, so that each is one
			// RPC, whatever the Go client does to its callers' checks.
			if opts == nil {
				opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
			}
			conn, err := grpc.NewClient(a, opts...)
			if err != nil {
				return nil, fmt.Errorf("dial %s: %w", a, err)
			}
			*closers = append(*closers, func() { conn.Close() })
			checkers[i] = grpcChecker{rl: pb.NewRateLimiterClient(conn), l: o.limit()}
		}
	case o.Protocol == "http":
		base := http.DefaultTransport.(*http.Transport).Clone()
		base.MaxIdleConns = o.Concurrency + len(o.Addrs)
		base.MaxIdleConnsPerHost = o.Concurrency
		for i, a := range o.Addrs {
			// A transport per node: each verifies its own node's name.
			url, tr, err := httpBase(o.TLS, a, base)
			if err != nil {
				return nil, err
			}
			*closers = append(*closers, tr.CloseIdleConnections)
			checkers[i] = &httpChecker{hc: &http.Client{Transport: tr}, url: url + "/v1/check", o: o}
		}
	}
	return checkers, nil
}

// memberMetrics returns the HTTP addresses of the alive members that the
// node at o.Metrics[0] lists, for --metrics-members. A member that
// gossips no HTTP address (a node of an older version) is an error: its
// CPU would be left out unseen.
func memberMetrics(ctx context.Context, o benchOptions) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	base, tr, err := httpBase(o.TLS, o.Metrics[0], http.DefaultTransport.(*http.Transport))
	if err != nil {
		return nil, err
	}
	defer tr.CloseIdleConnections()
	ms, err := nodeHTTP{addr: o.Metrics[0], base: base, hc: &http.Client{Transport: tr}}.members(ctx)
	if err != nil {
		return nil, fmt.Errorf("--metrics-members: %w", err)
	}
	var addrs []string
	for _, m := range ms {
		switch {
		case m.State != string(cluster.Alive):
		case m.HTTPAddr == "":
			return nil, fmt.Errorf("--metrics-members: member %q gossips no HTTP address (an older version?): list the nodes in --metrics", m.Name)
		default:
			addrs = append(addrs, m.HTTPAddr)
		}
	}
	addrs = distinct(addrs)
	switch {
	case len(addrs) == 0:
		return nil, fmt.Errorf("--metrics-members: %s lists no alive member", o.Metrics[0])
	case len(addrs) > maxMetricsMembers:
		return nil, fmt.Errorf("--metrics-members: %s lists %d alive members, more than the %d bench reads: list the nodes in --metrics",
			o.Metrics[0], len(addrs), maxMetricsMembers)
	}
	return addrs, nil
}

// maxMetricsMembers bounds the members --metrics-members measures: far
// more than a cluster has, so that a member list that is wrong (or forged)
// cannot make bench open connections without end.
const maxMetricsMembers = 1000

// cpuMeter measures the CPU that the nodes in --metrics use during a run.
type cpuMeter struct {
	nodes   []nodeHTTP
	before  []float64
	unknown []error // why a node's CPU is unknown; nil where it is known
	timeout time.Duration
}

// newCPUMeter returns a meter of o.Metrics, and adds to closers what
// releases its connections.
func newCPUMeter(o benchOptions, closers *[]func()) (*cpuMeter, error) {
	m := &cpuMeter{
		before: make([]float64, len(o.Metrics)), unknown: make([]error, len(o.Metrics)), timeout: o.Timeout,
	}
	for _, a := range o.Metrics {
		base, tr, err := httpBase(o.TLS, a, http.DefaultTransport.(*http.Transport))
		if err != nil {
			return nil, err
		}
		*closers = append(*closers, tr.CloseIdleConnections)
		m.nodes = append(m.nodes, nodeHTTP{addr: a, base: base, hc: &http.Client{Transport: tr}})
	}
	return m, nil
}

// start reads each node's CPU time so far, and returns how many alive
// members the first node lists (0 if it does not say). A node that does
// not answer is an error, naming --metrics: the run has not begun, and the
// address is likely wrong. One that answers without the figure is not.
func (m *cpuMeter) start(ctx context.Context) (members int, err error) {
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	for i, n := range m.nodes {
		m.before[i], m.unknown[i] = n.cpu(ctx)
		if err := m.unknown[i]; err != nil && !errors.Is(err, errCPUUnknown) {
			return 0, fmt.Errorf("--metrics: %w", err)
		}
	}
	if len(m.nodes) > 0 {
		if ms, err := m.nodes[0].members(ctx); err == nil {
			members = aliveMembers(ms)
		}
	}
	return members, nil
}

// stop reads each node's CPU time again and returns what it used since
// start. It reads even if ctx was cancelled, so that an interrupted run
// still reports its CPU.
func (m *cpuMeter) stop(ctx context.Context) []nodeCPU {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.timeout)
	defer cancel()
	out := make([]nodeCPU, len(m.nodes))
	for i, n := range m.nodes {
		out[i].Addr = n.addr
		after, err := n.cpu(ctx)
		if err == nil {
			err = m.unknown[i]
		}
		if err != nil {
			out[i].Error = err.Error()
			continue
		}
		// Rounded to the µs: the counter is coarser (10ms on Linux), and
		// the subtraction leaves float noise in the last digits.
		used := math.Round((after-m.before[i])*1e6) / 1e6
		out[i].CPUSeconds = &used
	}
	return out
}

// workerResult is one worker's tally. Only that worker writes it; its
// counts may be read while it runs, the rest once it has returned.
type workerResult struct {
	requests, errors, under, over atomic.Int64
	firstErr                      error
	latency                       latency.Histogram
}

// sum is what the workers have counted so far.
func sum(results []workerResult) tally {
	var t tally
	for i := range results {
		t.answered += results[i].under.Load() + results[i].over.Load()
		t.errors += results[i].errors.Load()
	}
	return t
}

// runWorker sends requests one after another until the shared count is
// spent, the deadline passes or ctx is cancelled, and counts them in res.
func runWorker(ctx context.Context, o benchOptions, c checker, id uint64, deadline time.Time, issued *atomic.Int64, res *workerResult) {
	next := keySource(o, id)
	keys := make([]int, o.Items)
	for ctx.Err() == nil && time.Now().Before(deadline) && issued.Add(1) <= o.Count {
		for i := range keys {
			keys[i] = next()
		}
		rctx, cancel := context.WithTimeout(ctx, o.Timeout)
		t0 := time.Now()
		under, over, err := c.check(rctx, keys)
		took := time.Since(t0)
		cancel()
		if err != nil && ctx.Err() != nil {
			break // cut off by the caller, not a failure of the node
		}
		res.requests.Add(1)
		res.latency.Record(took)
		res.under.Add(under)
		res.over.Add(over)
		if err != nil {
			res.errors.Add(1)
			if res.firstErr == nil {
				res.firstErr = err
			}
		}
	}
}

// keySource returns worker id's draw of key numbers, 0 .. o.Keys-1, from
// o.KeysDist. It comes from a PCG seeded by the id, so runs are repeatable.
func keySource(o benchOptions, id uint64) func() int {
	rng := rand.New(rand.NewPCG(id, 0x72696e676c696d74))
	if o.KeysDist == "zipf" {
		z := rand.NewZipf(rng, o.ZipfS, 1, uint64(o.Keys-1))
		return func() int { return int(z.Uint64()) }
	}
	return func() int { return rng.IntN(o.Keys) }
}
