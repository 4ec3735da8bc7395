package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/rlqs/envoysim"
)

// runRLQSBench is `rlnode bench-rlqs`: simulated Envoys (rlqs/envoysim,
// which does what Envoy's rate_limit_quota filter does, reporting every
// 5 s, with DENY_ALL as its no-assignment and expired-assignment
// behaviour) on one bucket of
// a cluster's quota service, asking far more than its limit, with one of
// them asking most of the demand from --skew-after on; it prints what was
// admitted each second, against the limit, and each Envoy's share.
func runRLQSBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rlnode bench-rlqs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	withUsage(fs, `Usage: rlnode bench-rlqs --addrs A,B,C --domain D --bucket K=V --limit N [flags]

Simulated Envoys, each streaming to its node of --addrs (Envoy i to the
i-th, round the list; when its node refuses it, to the next), ask the
bucket about --rate times a second a caller, one caller each, until
--duration. From --skew-after on, Envoy 0 asks with --skew-callers
callers. Every second it prints the admissions, the limit (--limit, a
second, as the policy says), and each Envoy's admissions; at the end, the
highest second, the mean, and Envoy 0's share after the skew. Stop a
node meanwhile (SIGTERM) to see its streams move.`)
	addrs := fs.String("addrs", "127.0.0.1:8081", "comma-separated gRPC addresses of the nodes")
	domain := fs.String("domain", "edge", "the policy domain")
	bucketFlag := fs.String("bucket", "tenant=t0", "the bucket_id, comma-separated key=value")
	limit := fs.Int64("limit", 0, "the bucket's policy limit, a second (for the figures only)")
	envoys := fs.Int("envoys", 4, "simulated Envoys")
	interval := fs.Duration("interval", envoysim.ReportInterval, "the Envoys' report interval (Envoy's filter reports every 5 s, whatever reporting_interval says)")
	duration := fs.Duration("duration", 3*time.Minute, "how long to run")
	rate := fs.Int("rate", 1000, "requests a second each caller asks")
	skewAfter := fs.Duration("skew-after", time.Minute, "when Envoy 0 starts asking with --skew-callers callers (0: never)")
	skewCallers := fs.Int("skew-callers", 7, "Envoy 0's callers from --skew-after on")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	bucket := map[string]string{}
	for _, kv := range strings.Split(*bucketFlag, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || v == "" {
			return fmt.Errorf("--bucket: %q is not key=value", kv)
		}
		bucket[k] = v
	}
	switch {
	case *envoys <= 0 || *envoys > 64:
		return errors.New("--envoys: must be between 1 and 64")
	case *interval <= 100*time.Millisecond:
		return errors.New("--interval: must be over 100ms, as Envoy's reporting_interval")
	case *rate <= 0 || *rate > 100_000:
		return errors.New("--rate: must be between 1 and 100000")
	case *skewCallers <= 0 || *skewCallers > 1000:
		return errors.New("--skew-callers: must be between 1 and 1000")
	case *duration <= 0:
		return errors.New("--duration: must be positive")
	}
	var conns []*grpc.ClientConn
	for _, a := range strings.Split(*addrs, ",") {
		cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("--addrs: %w", err)
		}
		defer cc.Close()
		conns = append(conns, cc)
	}
	ctx, cancel := context.WithTimeout(ctx, *duration+time.Second)
	defer cancel()
	start := time.Now().Truncate(time.Second).Add(time.Second)
	end := start.Add(*duration)
	seconds := int(*duration / time.Second)
	deny := &typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_BlanketRule_{BlanketRule: typepb.RateLimitStrategy_DENY_ALL}}
	counts := make([][]atomic.Int64, *envoys)
	sims := make([]*envoysim.Envoy, *envoys)
	var wg sync.WaitGroup
	for i := range sims {
		counts[i] = make([]atomic.Int64, seconds)
		order := append(append([]*grpc.ClientConn(nil), conns[i%len(conns):]...), conns[:i%len(conns)]...)
		sims[i] = envoysim.New(envoysim.Config{Conn: envoysim.Endpoints(order), Domain: *domain, Interval: *interval,
			Settings: envoysim.Settings{NoAssignment: deny, Expired: deny, ExpiredTimeout: envoysim.ReportInterval}})
		wg.Go(func() { sims[i].Run(ctx) })
		callers := 1
		for k := range callers + *skewCallers - 1 {
			if k > 0 && (i != 0 || *skewAfter == 0) {
				break
			}
			from := start.Add(-time.Second)
			if k > 0 {
				from = start.Add(*skewAfter)
			}
			wg.Go(func() {
				gap := time.Second / time.Duration(*rate)
				time.Sleep(time.Until(from))
				for now := time.Now(); now.Before(end) && ctx.Err() == nil; now = time.Now() {
					if sims[i].Allow(bucket) && !now.Before(start) {
						counts[i][int(now.Sub(start)/time.Second)].Add(1)
					}
					time.Sleep(gap)
				}
			})
		}
	}
	wg.Wait()
	var peak, sum, mine, all int64
	for s := range seconds {
		var n int64
		per := make([]string, *envoys)
		for i := range sims {
			c := counts[i][s].Load()
			n += c
			per[i] = fmt.Sprint(c)
			if *skewAfter > 0 && time.Duration(s)*time.Second >= *skewAfter+2**interval {
				all += c
				if i == 0 {
					mine += c
				}
			}
		}
		peak, sum = max(peak, n), sum+n
		fmt.Fprintf(stdout, "second %3d: %6d admitted (limit %d), by Envoy %s\n", s, n, *limit, strings.Join(per, " "))
	}
	fmt.Fprintf(stdout, "highest second %d, mean %.1f a second (limit %d)\n", peak, float64(sum)/float64(seconds), *limit)
	// Steady state: from two report intervals on (the shares settle at
	// the second report) to the skew.
	from, to := int(2**interval/time.Second), seconds
	if *skewAfter > 0 {
		to = min(to, int(*skewAfter/time.Second))
	}
	if *limit > 0 && from < to {
		var steady int64
		for s := from; s < to; s++ {
			for i := range sims {
				steady += counts[i][s].Load()
			}
		}
		fmt.Fprintf(stdout, "steady state (seconds %d to %d): mean %.1f a second, %.1f%% of the limit\n", from, to, float64(steady)/float64(to-from), 100*float64(steady)/float64(int64(to-from)**limit))
	}
	if all > 0 {
		fmt.Fprintf(stdout, "Envoy 0, from its second report after the skew: %.1f%% of the admissions\n", 100*float64(mine)/float64(all))
	}
	for i, e := range sims {
		st := e.Stats()
		fmt.Fprintf(stdout, "Envoy %d: %d assignments, %d with zero time-to-live, %d streams, %d reports dropped\n", i, st.Assignments, st.ZeroTTL, st.Streams, st.Dropped)
	}
	return nil
}
