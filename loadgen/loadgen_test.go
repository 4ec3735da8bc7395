package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/api"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/node"
	"github.com/ringlimit/ringlimit/node/nodetest"
)

// startNode runs a node in this test process on loopback ports and
// returns its HTTP and gRPC addresses, and what stops it.
func startNode(t *testing.T) (httpAddr, grpcAddr string, stop func() error) {
	t.Helper()
	n, stop := nodetest.Start(t, nodetest.Config(t.Name()))
	return n.HTTPAddr(), n.GRPCAddr(), stop
}

// startCluster runs n nodes, each joining the first, and waits until each
// is ready and sees all n.
func startCluster(t *testing.T, n int) []*node.Node {
	t.Helper()
	var nodes []*node.Node
	for i := range n {
		conf := nodetest.Config(fmt.Sprint("node-", i))
		if i > 0 {
			conf.Join = []string{nodes[0].Cluster().GossipAddr()}
		}
		nd, _ := nodetest.Start(t, conf)
		nodes = append(nodes, nd)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) { // polling for convergence
		converged := true
		for _, nd := range nodes {
			converged = converged && nd.Cluster().Ready() && nd.Cluster().Ring().Len() == n
		}
		if converged {
			return nodes
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d nodes did not converge within 20s", n)
		}
	}
}

// benchOpts are small runs bounded by Count. Duration is only a safety
// net, generous so that a loaded machine running -race still reaches Count.
func benchOpts(protocol, addr string) Options {
	return Options{
		Addrs: []string{addr}, Protocol: protocol, Items: 1, Concurrency: 8,
		Duration: 30 * time.Second, Count: 2000, Keys: 100, KeysDist: "uniform", Name: "bench",
		Behavior: pb.Behavior_BATCHED, Algorithm: pb.Algorithm_TOKEN_BUCKET,
		Limit: 1_000_000, Period: time.Second, Timeout: 5 * time.Second,
	}
}

func checkReport(t *testing.T, rep Report, count int64, items int) {
	t.Helper()
	if rep.Requests != count || rep.Errors != 0 || rep.Checks != count*int64(items) {
		t.Errorf("requests %d, errors %d, checks %d; want %d, 0, %d (first error: %s)",
			rep.Requests, rep.Errors, rep.Checks, count, count*int64(items), rep.FirstError)
	}
	if rep.Answered != rep.Checks || rep.Admitted != rep.Checks || rep.Refused != 0 {
		t.Errorf("answered %d, admitted %d, refused %d; want %d, %d, 0", rep.Answered, rep.Admitted, rep.Refused, rep.Checks, rep.Checks)
	}
	l := rep.LatencyUs
	if !(0 < l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.P999 && l.P999 <= l.Max) {
		t.Errorf("latencies %+v µs: want 0 < p50 <= p90 <= p99 <= p99.9 <= max", l)
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
			rep, err := Run(context.Background(), o)
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
	rep, err := Run(context.Background(), o)
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
	done := make(chan Report, 1)
	go func() {
		rep, err := Run(context.Background(), o)
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
	done := make(chan Report, 1)
	go func() {
		rep, err := Run(ctx, o)
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

// TestBenchReportsErrors: a node that refuses every item is measured, and
// its errors are counted and returned, not hidden.
func TestBenchReportsErrors(t *testing.T) {
	_, grpcAddr, stop := startNode(t)
	defer stop()
	o := benchOpts("grpc", grpcAddr)
	o.Count = 20
	o.Algorithm = pb.Algorithm_SLIDING_LOG
	o.Limit = 1 << 62 // above SLIDING_LOG's maximum: every item has an error
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests != 20 || rep.Errors != 20 || rep.FirstError == "" {
		t.Errorf("requests %d, errors %d, first error %q; want 20, 20, the item's error", rep.Requests, rep.Errors, rep.FirstError)
	}
	if rep.Checks != 20 || rep.Answered != 0 || rep.Admitted != 0 || rep.Refused != 0 {
		t.Errorf("checks %d, answered %d, admitted %d, refused %d; want 20, 0, 0, 0: a failed item is no answer",
			rep.Checks, rep.Answered, rep.Admitted, rep.Refused)
	}
}

// fakeNode serves GET /metrics with a CPU time that grows by step at each
// read, from first, and GET /v1/members with members alive; metrics ""
// serves no CPU time at all.
func fakeNode(t *testing.T, metrics string, first, step float64, members int) string {
	t.Helper()
	var reads atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "# TYPE go_goroutines gauge\ngo_goroutines 7")
		if metrics != "" {
			fmt.Fprintf(w, "# TYPE %s counter\n%s %g\n", metrics, metrics, first+step*float64(reads.Add(1)-1))
		}
	})
	mux.HandleFunc("GET /v1/members", func(w http.ResponseWriter, r *http.Request) {
		var ms []api.Member
		for i := range members {
			ms = append(ms, api.Member{Name: fmt.Sprintf("n%d", i), State: "alive"})
		}
		ms = append(ms, api.Member{Name: "gone", State: "dead"})
		json.NewEncoder(w).Encode(map[string]any{"members": ms})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestBenchCPUFromMetrics: CPU per check is the sum over the --metrics
// nodes of what their process_cpu_seconds_total grew by, over the checks
// answered; a cluster with more members than were measured is reported.
func TestBenchCPUFromMetrics(t *testing.T) {
	_, grpcAddr, stop := startNode(t)
	defer stop()
	a := fakeNode(t, cpuMetric, 10, 0.25, 3) // 0.25 s during the run
	b := fakeNode(t, cpuMetric, 100, 1.5, 3) // 1.5 s
	o := benchOpts("grpc", grpcAddr)
	o.Items = 4
	o.Count = 500
	o.Metrics = []string{a, b}
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, o.Count, o.Items)
	want := 1.75 * 1e6 / 2000
	if rep.CPUUsPerCheck == nil || math.Abs(*rep.CPUUsPerCheck-want) > 1e-9 {
		t.Errorf("cpu_us_per_check %v, want %v", ptrString(rep.CPUUsPerCheck), want)
	}
	if len(rep.Nodes) != 2 || rep.Nodes[0].Addr != a || rep.Nodes[1].Addr != b ||
		ptrString(rep.Nodes[0].CPUSeconds) != "0.25" || ptrString(rep.Nodes[1].CPUSeconds) != "1.5" {
		t.Errorf("nodes %+v, want %s 0.25s and %s 1.5s", rep.Nodes, a, b)
	}
	if rep.Members != 3 {
		t.Errorf("members %d, want the 3 alive ones", rep.Members)
	}
	var out strings.Builder
	if err := Print(&out, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"875.0µs", "only 2 of 3 alive members measured"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func ptrString(p *float64) string {
	if p == nil {
		return "nil"
	}
	return strconv.FormatFloat(*p, 'g', -1, 64)
}

// TestBenchCPUUnknown: a node that serves metrics without its CPU time
// leaves CPU per check unknown, and the run measured as usual.
func TestBenchCPUUnknown(t *testing.T) {
	_, grpcAddr, stop := startNode(t)
	defer stop()
	o := benchOpts("grpc", grpcAddr)
	o.Count = 100
	o.Metrics = []string{fakeNode(t, cpuMetric, 1, 1, 1), fakeNode(t, "", 0, 0, 1)}
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, o.Count, o.Items)
	if rep.CPUUsPerCheck != nil || rep.Nodes[1].CPUSeconds != nil || !strings.Contains(rep.Nodes[1].Error, "not served") {
		t.Errorf("cpu_us_per_check %s, nodes %+v; want unknown, for the second node's metric is not served",
			ptrString(rep.CPUUsPerCheck), rep.Nodes)
	}
	var out strings.Builder
	if err := Print(&out, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "unknown") || !strings.Contains(out.String(), "not served") {
		t.Errorf("table does not say why CPU is unknown:\n%s", out.String())
	}

	o.Metrics = nil
	rep, err = Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.CPUUsPerCheck != nil || len(rep.Nodes) != 0 || rep.Members != 0 {
		t.Errorf("without --metrics: cpu %s, nodes %v, members %d; want unknown, none, 0",
			ptrString(rep.CPUUsPerCheck), rep.Nodes, rep.Members)
	}
}

// TestBenchMetricsUnreachable: a --metrics address that does not answer
// fails the run before it starts, naming the flag.
func TestBenchMetricsUnreachable(t *testing.T) {
	_, grpcAddr, stop := startNode(t)
	defer stop()
	o := benchOpts("grpc", grpcAddr)
	o.Metrics = []string{"127.0.0.1:1"}
	rep, err := Run(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "--metrics") || rep.Requests != 0 {
		t.Errorf("bench = %d requests, %v; want none and an error naming --metrics", rep.Requests, err)
	}
	// A gRPC port is no metrics address either.
	o.Metrics = []string{grpcAddr}
	if _, err := Run(context.Background(), o); err == nil || !strings.Contains(err.Error(), "--metrics") {
		t.Errorf("bench with --metrics at the gRPC port: %v, want an error naming --metrics", err)
	}
}

// TestBenchMetricsMembers: with --metrics-members, one node named is
// enough: bench measures every alive member it lists, at the HTTP address
// each gossips. A member that gossips none is an error, not a node left
// out unseen.
func TestBenchMetricsMembers(t *testing.T) {
	nodes := startCluster(t, 3)
	o := benchOpts("grpc", nodes[1].GRPCAddr())
	o.Count = 100
	o.Metrics, o.MetricsMembers = []string{nodes[0].HTTPAddr()}, true
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var measured, want []string
	for _, n := range rep.Nodes {
		if n.CPUSeconds == nil {
			t.Errorf("node %s: CPU unknown: %s", n.Addr, n.Error)
		}
		measured = append(measured, n.Addr)
	}
	for _, n := range nodes {
		want = append(want, n.HTTPAddr())
	}
	slices.Sort(measured)
	slices.Sort(want)
	if !slices.Equal(measured, want) || len(rep.Options.Metrics) != len(want) {
		t.Errorf("measured %v (options.metrics %v), want the three members %v", measured, rep.Options.Metrics, want)
	}
	if !rep.Options.MetricsMembers || rep.Members != 3 || rep.CPUUsPerCheck == nil {
		t.Errorf("metrics_members %v, members %d, cpu_us_per_check %s; want true, 3, known",
			rep.Options.MetricsMembers, rep.Members, ptrString(rep.CPUUsPerCheck))
	}

	o.Metrics = []string{fakeNode(t, cpuMetric, 1, 1, 2)} // lists members without HTTP addresses
	if _, err := Run(context.Background(), o); err == nil || !strings.Contains(err.Error(), "--metrics-members") {
		t.Errorf("bench with members that gossip no HTTP address: %v, want an error naming --metrics-members", err)
	}

	// A node that lists more members than any cluster has is not believed.
	var many []api.Member
	for i := range maxMetricsMembers + 1 {
		many = append(many, api.Member{Name: fmt.Sprint("m", i), State: "alive", HTTPAddr: fmt.Sprintf("127.0.0.1:%d", 10000+i)})
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"members": many})
	}))
	defer srv.Close()
	o.Metrics = []string{strings.TrimPrefix(srv.URL, "http://")}
	if _, err := Run(context.Background(), o); err == nil || !strings.Contains(err.Error(), "more than the 1000") {
		t.Errorf("bench with %d members listed: %v, want a refusal naming the bound", len(many), err)
	}
}

// TestBenchClient: with --client, the load goes through client.Allow, one
// check per call, and a node's refusals are counted as such: one key of
// limit 100 admits exactly 100 of 300 calls.
func TestBenchClient(t *testing.T) {
	httpAddr, grpcAddr, stop := startNode(t)
	defer stop()
	o := benchOpts("grpc", grpcAddr)
	o.Client = true
	o.Count = 300
	o.Keys = 1
	o.Limit = 100
	o.Period = time.Hour
	o.Metrics = []string{httpAddr}
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests != 300 || rep.Checks != 300 || rep.Answered != 300 || rep.Admitted != 100 || rep.Refused != 200 || rep.Errors != 0 {
		t.Errorf("requests %d, checks %d, answered %d, admitted %d, refused %d, errors %d; want 300, 300, 300, 100, 200, 0 (first error: %s)",
			rep.Requests, rep.Checks, rep.Answered, rep.Admitted, rep.Refused, rep.Errors, rep.FirstError)
	}
	if rep.Options.Mode != "client" || rep.CPUUsPerCheck == nil || *rep.CPUUsPerCheck <= 0 {
		t.Errorf("mode %q, cpu_us_per_check %s; want client, > 0", rep.Options.Mode, ptrString(rep.CPUUsPerCheck))
	}
}

// TestBenchClientRoutes: with --route the client learns the cluster (one
// node here) and its checks are answered as without.
func TestBenchClientRoutes(t *testing.T) {
	httpAddr, grpcAddr, stop := startNode(t)
	defer stop()
	o := benchOpts("grpc", grpcAddr)
	o.Client, o.Route = true, true
	o.Count, o.Keys, o.Limit, o.Period = 300, 1, 100, time.Hour
	o.Metrics = []string{httpAddr}
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Answered != 300 || rep.Admitted != 100 || rep.Errors != 0 || rep.Options.Mode != "client-routed" {
		t.Errorf("answered %d, admitted %d, errors %d, mode %q; want 300, 100, 0, client-routed (first error: %s)",
			rep.Answered, rep.Admitted, rep.Errors, rep.Options.Mode, rep.FirstError)
	}
}

// TestKeySource: keys stay in range; Zipf keys favour the low numbers, so
// that bench:0 is the hottest key, while uniform ones do not.
func TestKeySource(t *testing.T) {
	const keys, draws = 1000, 20_000
	for _, tc := range []struct {
		dist     string
		s        float64
		hotShare float64 // of draws that are key 0: at least for zipf, at most for uniform
	}{
		{"uniform", 0, 0.01}, // expected 1/1000
		{"zipf", 1.1, 0.1},   // 1/ζ-ish: about 1/(1+Σ(k+1)^-1.1) ≈ 0.14 over 1000 keys
		{"zipf", 2, 0.5},     // about 0.61
	} {
		t.Run(fmt.Sprintf("%s/%v", tc.dist, tc.s), func(t *testing.T) {
			next := keySource(Options{Keys: keys, KeysDist: tc.dist, ZipfS: tc.s}, 7)
			hot := 0
			for range draws {
				k := next()
				if k < 0 || k >= keys {
					t.Fatalf("key %d, want 0 to %d", k, keys-1)
				}
				if k == 0 {
					hot++
				}
			}
			share := float64(hot) / draws
			if tc.dist == "uniform" && share > tc.hotShare || tc.dist == "zipf" && share < tc.hotShare {
				t.Errorf("key 0 drawn %.3f of the time; want %s %v", share, map[bool]string{true: "at most", false: "at least"}[tc.dist == "uniform"], tc.hotShare)
			}
		})
	}
	next := keySource(Options{Keys: 1, KeysDist: "zipf", ZipfS: 1.5}, 1)
	for range 100 {
		if k := next(); k != 0 {
			t.Fatalf("one Zipf key: drew %d", k)
		}
	}
}

// TestShowProgress: on a terminal, one line rewritten each second and
// erased at the end; elsewhere, a plain line every 10 seconds.
func TestShowProgress(t *testing.T) {
	for _, tc := range []struct {
		tty  bool
		want string
	}{
		{true, "\r\x1b[K     1s  100 checks  100 checks/s  0 errors" +
			"\r\x1b[K     2s  300 checks  200 checks/s  1 errors" +
			"\r\x1b[K     3s  600 checks  300 checks/s  2 errors\r\x1b[K"},
		{false, "    10s  1000 checks  100 checks/s  0 errors\n" +
			"    20s  3000 checks  200 checks/s  1 errors\n" +
			"    30s  6000 checks  300 checks/s  2 errors\n"},
	} {
		t.Run(fmt.Sprintf("tty=%v", tc.tty), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				every := plainEvery
				if tc.tty {
					every = ttyEvery
				}
				var out strings.Builder
				var reads int64
				done := make(chan struct{})
				finished := make(chan struct{})
				go func() {
					showProgress(&out, tc.tty, time.Now(), done, func() tally {
						reads++ // read by showProgress only
						return tally{answered: reads * (reads + 1) / 2 * 100 * int64(every/time.Second), errors: reads - 1}
					})
					close(finished)
				}()
				time.Sleep(3*every + every/2)
				close(done)
				<-finished
				if out.String() != tc.want {
					t.Errorf("progress wrote\n%q\nwant\n%q", out.String(), tc.want)
				}
			})
		})
	}
}

// TestBenchWarmup: with Warmup, the load runs unrecorded first, and the
// report holds the run's requests only.
func TestBenchWarmup(t *testing.T) {
	_, grpcAddr, stop := startNode(t)
	defer stop()
	o := benchOpts("grpc", grpcAddr)
	o.Client = true
	o.Warmup = 100 * time.Millisecond
	o.Count = 500
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, o.Count, 1)
	if rep.Options.WarmupS != 0.1 {
		t.Errorf("options' warmup_s %v, want 0.1", rep.Options.WarmupS)
	}
	o.Warmup = -time.Second
	if _, err := Run(context.Background(), o); err == nil || !strings.Contains(err.Error(), "--warmup") {
		t.Errorf("a negative warm-up: %v, want an error naming --warmup", err)
	}
}
