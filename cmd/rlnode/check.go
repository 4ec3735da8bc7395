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
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/internal/nodeport"
	"github.com/ringlimit/ringlimit/loadgen"
)

// checkUsage heads `rlnode check -h`.
const checkUsage = `Usage: rlnode check --key KEY --limit N [flags]
       rlnode check --key KEY --min-interval D [flags]
       rlnode check --key KEY --limit N --ceiling C --parent-key P --parent-limit M [flags]
       rlnode check --key KEY --limit N --hits H --reserve-ttl D [flags]
       rlnode check --key KEY --settle ID --cost N [flags]
       rlnode check --key KEY --release ID [flags]

Spends --hits of a limit of --limit per --duration for --key on a node, over
gRPC, and prints the verdict (or JSON with --json). --min-interval also
refuses a request sooner than that after the last admitted one; without
--limit it is a spacing alone. --ceiling lets the key borrow beyond
--limit, up to the ceiling, while the parent (--parent-limit per
--parent-duration, shared by every key of --name that names --parent-key)
has room; the verdict says when it borrowed.

--hits 0 peeks: it charges nothing and says what a check of 1 would get
now (PEEK, with the hits remaining; when none remain, a check of 1 would
be refused, and is admitted again by the time the counter is full at the
latest; "admits_one" with --json). A peek exits 0 whatever it finds.

--reserve-ttl reserves the --hits instead of spending them, for work whose
cost is known only once it ends: admitted or refused as a spending check
would be, but held under a reservation id (printed, "reservation_id" with
--json) for that long (1ms to 24h), after which they are charged in full.
--settle ID --cost N then charges the real cost (less than reserved gives
the rest back, more charges the excess), and --release ID gives them all
back; both take the reservation's --name and --key, and no limit. A
settle sent again charges once. Not with --min-interval or --ceiling.

--addr is the node's gRPC port (its --grpc-addr), where rlnode members
takes its HTTP port.

Exit status: 0 allowed (UNDER_LIMIT) or settled, 1 refused (OVER_LIMIT), 2
an error: bad usage, an invalid check (the message names the field), an
unknown or expired reservation, or a node that cannot be reached within
--timeout.
`

// runCheck is `rlnode check`: one check against a node over gRPC, printed
// for a person, or as JSON with --json. A refused check returns errRefused
// after its verdict is printed.
func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rlnode check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	withUsage(fs, checkUsage)
	addr := fs.String("addr", "localhost:8081", "gRPC address of a node (its --grpc-addr)")
	name := fs.String("name", "cli", "limit name")
	key := fs.String("key", "", "the limited entity, e.g. user:42 (required)")
	limit := fs.Int64("limit", 0, "requests allowed per --duration (required)")
	duration := fs.Duration("duration", time.Minute, "the period")
	algorithm := fs.String("algorithm", "TOKEN_BUCKET", "TOKEN_BUCKET, GCRA, LEAKY_BUCKET, FIXED_WINDOW, SLIDING_WINDOW or SLIDING_LOG")
	hits := fs.Int64("hits", 1, "cost of this request; 0 peeks: it charges nothing and says whether a check of 1 would be admitted")
	burst := fs.Int64("burst", 0, "bucket capacity (0: --limit)")
	minInterval := fs.Duration("min-interval", 0, "least time between two admitted requests for --key (0: none; rounded up to the millisecond)")
	ceiling := fs.Int64("ceiling", 0, "borrow beyond --limit up to this many per --duration while the parent has room (0: no borrowing)")
	parentKey := fs.String("parent-key", "", "with --ceiling: the parent's key, shared by every key that names it")
	parentLimit := fs.Int64("parent-limit", 0, "with --ceiling: the parent's requests per --parent-duration")
	parentDuration := fs.Duration("parent-duration", 0, "with --ceiling: the parent's period (0: --duration)")
	reserveTTL := fs.Duration("reserve-ttl", 0, "reserve --hits for this long rather than spend them (0: spend; rounded up to the millisecond)")
	settle := fs.String("settle", "", "settle this reservation id of --name and --key with --cost")
	release := fs.String("release", "", "release this reservation id of --name and --key: give all its hits back")
	cost := fs.Int64("cost", -1, "with --settle: the hits really spent, 0 or more (-1: none given)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	timeout := fs.Duration("timeout", 5*time.Second, "give up after this long")
	tlsFlags := addClientTLS(fs)
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *settle != "" || *release != "" {
		return runSettle(ctx, settleArgs{addr: *addr, name: *name, key: *key, settle: *settle, release: *release, cost: *cost,
			asJSON: *asJSON, timeout: *timeout, tls: tlsFlags.config()}, stdout)
	}
	if *cost != -1 {
		return errors.New("check: --cost goes with --settle")
	}
	if *key == "" || *limit == 0 && *minInterval == 0 {
		return errors.New("check: --key and --limit (or --min-interval) are required")
	}
	if *limit == 0 {
		*duration = 0 // a spacing alone
	}
	alg, err := algorithms.ParseKind(*algorithm)
	if err != nil {
		return fmt.Errorf("--algorithm: %w", err)
	}
	opts, err := loadgen.DialOptions(tlsFlags.config(), *addr)
	if err != nil {
		return err
	}
	c, err := client.New(*addr, opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	l := client.Limit{Name: *name, Count: *limit, Period: *duration, Burst: *burst, Algorithm: client.Algorithm(alg), MinInterval: *minInterval,
		Ceiling: *ceiling, Parent: client.Parent{Key: *parentKey, Count: *parentLimit, Period: *parentDuration}}
	var d client.Decision
	var reservation string
	if *reserveTTL != 0 {
		var r *client.Reservation
		if r, err = c.Reserve(ctx, l, *key, *hits, *reserveTTL); err == nil {
			d, reservation = r.Decision, r.ID
		}
	} else {
		d, err = c.Take(ctx, l, *key, *hits)
	}
	if err != nil {
		if err := wrongPort(ctx, err, "rlnode check", *addr, nodeport.GRPC, tlsFlags.config()); errors.Is(err, nodeport.ErrWrongPort) {
			return err
		}
		return fmt.Errorf("check %s: %w", *addr, err)
	}
	peek := *hits == 0
	switch {
	case *asJSON:
		out := checkJSON(d)
		if peek {
			out["admits_one"] = admitsOne(d)
		}
		if reservation != "" {
			out["reservation_id"] = reservation
		}
		err = json.NewEncoder(stdout).Encode(out)
	case peek:
		_, err = fmt.Fprintln(stdout, describePeek(d, time.Now()))
	case reservation != "":
		_, err = fmt.Fprintf(stdout, "%s\nRESERVED %d under %s for %v: rlnode check --name %s --key %s --settle %s --cost N (or --release %s)\n",
			describe(d, time.Now()), *hits, reservation, *reserveTTL, *name, *key, reservation, reservation)
	default:
		_, err = fmt.Fprintln(stdout, describe(d, time.Now()))
	}
	if err == nil && !d.Allowed {
		return errRefused
	}
	return err
}

// checkJSON is d in the wire's JSON names, for scripts.
func checkJSON(d client.Decision) map[string]any {
	status := pb.Status_UNDER_LIMIT
	if !d.Allowed {
		status = pb.Status_OVER_LIMIT
	}
	retry := d.RetryAfter.Milliseconds()
	if d.RetryAfter == client.Never {
		retry = -1
	}
	out := map[string]any{
		"status": status.String(), "limit": d.Limit, "remaining": d.Remaining,
		"reset_time_ms": d.ResetAt.UnixMilli(), "retry_after_ms": retry, "delay_ms": d.Delay.Milliseconds(),
	}
	if d.DecidedBy != "" {
		out["decided_by"] = d.DecidedBy
	}
	if d.Borrowed {
		out["borrowed"] = true
	}
	return out
}

// describePeek says what a peek (a check of 0 hits, which is always
// admitted and charges nothing) found, as what a check of 1 would get:
// admitted while a hit remains; else refused now, and admitted again by
// the time the counter is full at the latest (the answer of a peek does
// not say sooner).
func describePeek(d client.Decision, now time.Time) string {
	reset := max(d.ResetAt.Sub(now).Round(time.Millisecond), 0)
	if d.Remaining >= d.Limit {
		// Full now: the server's reset time, read in whole milliseconds
		// on its own clock, can lie a millisecond past this one's.
		reset = 0
	}
	line := fmt.Sprintf("PEEK  %d of %d remaining, full again in %v: ", d.Remaining, d.Limit, reset)
	if admitsOne(d) {
		line += "a check of 1 would be admitted"
	} else {
		line += fmt.Sprintf("a check of 1 would be refused now, and admitted again within %v at the latest", reset)
	}
	if d.DecidedBy != "" {
		line += fmt.Sprintf(" (decided by %s)", d.DecidedBy)
	}
	return line
}

// admitsOne reports whether a check of 1 would be admitted now, by the
// answer d to a peek.
func admitsOne(d client.Decision) bool { return checks.AdmitsOne(d.Allowed, d.Remaining) }

// describe says a verdict in a line a person reads at a glance.
func describe(d client.Decision, now time.Time) string {
	reset := d.ResetAt.Sub(now).Round(time.Millisecond)
	verdict := "ALLOWED"
	if !d.Allowed {
		verdict = "REFUSED"
	}
	line := fmt.Sprintf("%s  %d of %d remaining, full again in %v", verdict, d.Remaining, d.Limit, max(reset, 0))
	switch {
	case d.RetryAfter == client.Never:
		line += "; never: more hits than the limit holds"
	case d.RetryAfter > 0:
		line += fmt.Sprintf("; retry in %v", d.RetryAfter)
	}
	if d.Delay > 0 {
		line += fmt.Sprintf("; wait %v before proceeding", d.Delay)
	}
	if d.Borrowed {
		line += "; borrowed beyond the limit"
	}
	if d.DecidedBy != "" {
		line += fmt.Sprintf(" (decided by %s)", d.DecidedBy)
	}
	return line
}
