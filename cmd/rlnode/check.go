package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
)

// runCheck is `rlnode check`: one check against a node over gRPC, printed
// for a person, or as JSON with --json.
func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rlnode check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "localhost:8081", "gRPC address of a node")
	name := fs.String("name", "cli", "limit name")
	key := fs.String("key", "", "the limited entity, e.g. user:42 (required)")
	limit := fs.Int64("limit", 0, "requests allowed per --duration (required)")
	duration := fs.Duration("duration", time.Minute, "the period")
	algorithm := fs.String("algorithm", "TOKEN_BUCKET", "TOKEN_BUCKET, GCRA, LEAKY_BUCKET, FIXED_WINDOW, SLIDING_WINDOW or SLIDING_LOG")
	hits := fs.Int64("hits", 1, "cost of this request; 0 asks without charging")
	burst := fs.Int64("burst", 0, "bucket capacity (0: --limit)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	timeout := fs.Duration("timeout", 5*time.Second, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *key == "" || *limit == 0 {
		return errors.New("check: --key and --limit are required")
	}
	alg, err := algorithms.ParseKind(*algorithm)
	if err != nil {
		return fmt.Errorf("--algorithm: %w", err)
	}
	c, err := client.New(*addr)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	resp, err := c.Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{{
		Name: *name, Key: *key, Hits: hits, Limit: *limit, DurationMs: duration.Milliseconds(),
		Algorithm: pb.Algorithm(alg), Burst: *burst,
	}}})
	if err != nil {
		return fmt.Errorf("check %s: %w", *addr, err)
	}
	r := resp.Responses[0]
	if *asJSON {
		enc := json.NewEncoder(stdout)
		return enc.Encode(map[string]any{
			"status": r.Status.String(), "limit": r.Limit, "remaining": r.Remaining,
			"reset_time_ms": r.ResetTimeMs, "retry_after_ms": r.RetryAfterMs, "delay_ms": r.DelayMs,
			"error": r.Error,
		})
	}
	if r.Error != "" {
		return fmt.Errorf("check: %s", r.Error)
	}
	fmt.Fprintln(stdout, describe(r, time.Now()))
	return nil
}

// describe says a verdict in a line a person reads at a glance.
func describe(r *pb.CheckResult, now time.Time) string {
	reset := time.UnixMilli(r.ResetTimeMs).Sub(now).Round(time.Millisecond)
	verdict := "ALLOWED"
	if r.Status == pb.Status_OVER_LIMIT {
		verdict = "REFUSED"
	}
	line := fmt.Sprintf("%s  %d of %d remaining, full again in %v", verdict, r.Remaining, r.Limit, max(reset, 0))
	switch {
	case r.RetryAfterMs < 0:
		line += "; never: more hits than the limit holds"
	case r.RetryAfterMs > 0:
		line += fmt.Sprintf("; retry in %v", time.Duration(r.RetryAfterMs)*time.Millisecond)
	}
	if r.DelayMs > 0 {
		line += fmt.Sprintf("; wait %v before proceeding", time.Duration(r.DelayMs)*time.Millisecond)
	}
	return line
}
