// Package loadgen is `rlnode bench`: a bounded load generator that sends
// checks to one or more nodes over gRPC, HTTP or the Go client, and
// reports throughput, latency percentiles and the server CPU a check
// cost, read from the nodes' /metrics. It talks to nodes through their
// public ports only; cmd/rlnode parses the subcommand's flags into
// Options and prints the Report.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/cluster"
	"github.com/ringlimit/ringlimit/internal/latency"
)

// Options says what `rlnode bench` sends, where, and for how long.
type Options struct {
	Addrs       []string // nodes; worker i talks to Addrs[i%len(Addrs)]
	Protocol    string   // "grpc" or "http"
	Client      bool     // call client.Allow, one item a call, instead of sending Check requests
	Route       bool     // with Client: one client over all Addrs, sending each check to its key's owner
	Lease       bool     // with Client: the limit is leased, its checks decided in the client from grants
	Items       int      // items per request, 1..checks.MaxItems
	Concurrency int      // workers, each with one request in flight
	Duration    time.Duration
	// Warmup, if positive, runs the same load for this long before the
	// run, unrecorded: the clients' connections are open and the process
	// warm when the clock starts.
	Warmup   time.Duration
	Count    int64    // requests in total; the run stops at Count or Duration, whichever comes first
	Keys     int      // distinct keys bench:0 .. bench:<Keys-1>
	KeysDist string   // "uniform", or "zipf": bench:0 the most frequent
	ZipfS    float64  // the Zipf exponent s > 1, with KeysDist "zipf"
	Metrics  []string // HTTP addresses of the nodes whose CPU is measured; none: unknown
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
func (o Options) validate() error {
	switch {
	case len(o.Addrs) == 0:
		return errors.New("--addr: no address")
	case o.Protocol != "grpc" && o.Protocol != "http":
		return fmt.Errorf("--protocol: %q, want grpc or http", o.Protocol)
	case o.Client && o.Protocol != "grpc":
		return fmt.Errorf("--client: the Go client speaks grpc, not --protocol %s", o.Protocol)
	case o.Items < 1 || o.Items > checks.MaxItems:
		return fmt.Errorf("--items: %d, want 1 to %d", o.Items, checks.MaxItems)
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
	case o.Warmup < 0:
		return fmt.Errorf("--warmup: %v, want >= 0", o.Warmup)
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
func (o Options) limit() client.Limit {
	return client.Limit{Name: o.Name, Count: o.Limit, Period: o.Period, Algorithm: o.Algorithm, Behavior: o.Behavior, Lease: o.Lease}
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

// Run runs o.Concurrency workers until o.Count requests have been sent
// in total, o.Duration has passed, or ctx is cancelled, and reports what
// they measured. Requests in flight when the duration ends are allowed to
// finish; those cut off by ctx are left out of the report. A node in
// o.Metrics that cannot be read before the run is an error; one listed
// twice is measured once.
func Run(ctx context.Context, o Options) (Report, error) {
	if err := o.validate(); err != nil {
		return Report{}, err
	}
	o.Metrics = distinct(o.Metrics) // a node listed twice would count twice
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	checkers, err := newCheckers(o, &closers)
	if err != nil {
		return Report{}, err
	}
	if o.MetricsMembers {
		if o.Metrics, err = memberMetrics(ctx, o); err != nil {
			return Report{}, err
		}
	}
	if o.Warmup > 0 {
		var wg sync.WaitGroup
		runWorkers(ctx, o, checkers, time.Now().Add(o.Warmup), make([]workerResult, o.Concurrency), &wg)
		wg.Wait()
	}
	meter, err := newCPUMeter(o, &closers)
	if err != nil {
		return Report{}, err
	}
	members, err := meter.start(ctx)
	if err != nil {
		return Report{}, err
	}

	results := make([]workerResult, o.Concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	runWorkers(ctx, o, checkers, start.Add(o.Duration), results, &wg)
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

// runWorkers starts o.Concurrency workers, counted in wg, that send
// requests until o.Count have been sent, deadline passes or ctx is
// cancelled, worker w through checkers[w%len(checkers)] and into
// results[w].
func runWorkers(ctx context.Context, o Options, checkers []checker, deadline time.Time, results []workerResult, wg *sync.WaitGroup) {
	issued := new(atomic.Int64)
	for w := range o.Concurrency {
		wg.Go(func() {
			runWorker(ctx, o, checkers[w%len(checkers)], uint64(w), deadline, issued, &results[w])
		})
	}
}

// newCheckers returns a checker per address in o.Addrs, and adds to
// closers what releases them.
func newCheckers(o Options, closers *[]func()) ([]checker, error) {
	checkers := make([]checker, len(o.Addrs))
	switch {
	case o.Route:
		opts, err := DialOptions(o.TLS, o.Addrs[0])
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
			opts, err := DialOptions(o.TLS, a)
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
func memberMetrics(ctx context.Context, o Options) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	n, err := NewNode(o.Metrics[0], o.TLS)
	if err != nil {
		return nil, err
	}
	defer n.Close()
	ms, err := n.Members(ctx)
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
	nodes   []Node
	before  []float64
	unknown []error // why a node's CPU is unknown; nil where it is known
	timeout time.Duration
}

// newCPUMeter returns a meter of o.Metrics, and adds to closers what
// releases its connections.
func newCPUMeter(o Options, closers *[]func()) (*cpuMeter, error) {
	m := &cpuMeter{
		before: make([]float64, len(o.Metrics)), unknown: make([]error, len(o.Metrics)), timeout: o.Timeout,
	}
	for _, a := range o.Metrics {
		n, err := NewNode(a, o.TLS)
		if err != nil {
			return nil, err
		}
		*closers = append(*closers, n.Close)
		m.nodes = append(m.nodes, n)
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
		if ms, err := m.nodes[0].Members(ctx); err == nil {
			members = aliveMembers(ms)
		}
	}
	return members, nil
}

// stop reads each node's CPU time again and returns what it used since
// start. It reads even if ctx was cancelled, so that an interrupted run
// still reports its CPU.
func (m *cpuMeter) stop(ctx context.Context) []NodeCPU {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.timeout)
	defer cancel()
	out := make([]NodeCPU, len(m.nodes))
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
func runWorker(ctx context.Context, o Options, c checker, id uint64, deadline time.Time, issued *atomic.Int64, res *workerResult) {
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
func keySource(o Options, id uint64) func() int {
	rng := rand.New(rand.NewPCG(id, 0x72696e676c696d74))
	if o.KeysDist == "zipf" {
		z := rand.NewZipf(rng, o.ZipfS, 1, uint64(o.Keys-1))
		return func() int { return int(z.Uint64()) }
	}
	return func() int { return rng.IntN(o.Keys) }
}
