package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/loadgen"
)

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
otherwise a line every 10s. --json prints one JSON object (see docs/cli.md).
`)
	addr := fs.String("addr", "", "address of a node (default localhost:8081 for grpc, localhost:8080 for http)")
	addrs := fs.String("addrs", "", "comma-separated node addresses; workers are spread over them round-robin (overrides --addr)")
	protocol := fs.String("protocol", "grpc", "grpc or http")
	useClient := fs.Bool("client", false, "call the Go client's Allow, one check a call, instead of sending Check requests (grpc only)")
	lease := fs.Bool("lease", false, "with --client: lease the limit, so that the client decides its checks from grants the keys' owners lend it (docs/leases.md)")
	route := fs.Bool("route", false, "with --client: one client that learns the cluster's ring through the addresses and sends each check straight to its key's owner")
	metrics := fs.String("metrics", "", "comma-separated HTTP addresses of the nodes whose CPU is measured (default: see above)")
	metricsMembers := fs.Bool("metrics-members", false, "measure every alive member the first --metrics node lists, instead of the --metrics list")
	items := fs.Int("items", 1, fmt.Sprintf("items per request (1 to %d)", checks.MaxItems))
	concurrency := fs.Int("concurrency", 64, "workers, each with one request in flight")
	duration := fs.Duration("duration", 10*time.Second, "stop after this long")
	warmup := fs.Duration("warmup", 0, "first run the same load for this long, unrecorded, so that the clock starts with the connections open")
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
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	opts := loadgen.Options{
		Protocol: *protocol, Client: *useClient, Route: *route, Lease: *lease, Items: *items, Concurrency: *concurrency, Duration: *duration, Warmup: *warmup,
		Count: *count, Keys: *keys, KeysDist: *keysDist, ZipfS: *zipfS, Name: *name, Limit: *limit,
		Period: *period, Timeout: *timeout, TLS: tlsFlags.config(), Progress: stderr, TTY: loadgen.IsTerminal(stderr),
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

	rep, err := loadgen.Run(ctx, opts)
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
	} else if err := loadgen.Print(stdout, rep); err != nil {
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
