package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ringlimit/ringlimit/internal/nodeport"
	"github.com/ringlimit/ringlimit/loadgen"
	"github.com/ringlimit/ringlimit/status"
	"github.com/ringlimit/ringlimit/top"
)

// clearScreen moves a terminal's cursor home and clears it: how `rlnode
// top` redraws.
const clearScreen = "\x1b[H\x1b[2J"

// runTop is `rlnode top`: who is being limited across the cluster, from a
// node's GET /v1/top, redrawn every --interval, or printed once.
func runTop(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rlnode top", flag.ContinueOnError)
	fs.SetOutput(stderr)
	withUsage(fs, `Usage: rlnode top [--addr HOST:PORT] [--once] [--sort checks|refusals] [--tls-ca FILE ...]

Shows who is being limited across the cluster: the keys checked most (or,
with --sort refusals, refused most) under each limit name, with their
checks/s and refusals/s, and each member's totals, from a node's
GET /v1/top, which asks every member. Redrawn every --interval until
interrupted; --once prints once, without terminal codes, for scripts and
tests. Counts are estimates with a bounded error (docs/operations.md).
`)
	addr := fs.String("addr", "localhost:8080", "HTTP address of a node (its --http-addr)")
	once := fs.Bool("once", false, "print once and exit, without clearing the screen")
	interval := fs.Duration("interval", 2*time.Second, "time between redraws")
	rows := fs.Int("keys", 20, fmt.Sprintf("keys shown, 1 to %d", top.MaxKeys))
	sortBy := fs.String("sort", "checks", "order keys by checks or refusals (per second)")
	timeout := fs.Duration("timeout", 5*time.Second, "give up on one read of the node after this long")
	tlsFlags := addClientTLS(fs)
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	switch {
	case *rows < 1 || *rows > top.MaxKeys:
		return fmt.Errorf("--keys: must be from 1 to %d, got %d", top.MaxKeys, *rows)
	case *sortBy != "checks" && *sortBy != "refusals":
		return fmt.Errorf("--sort: must be checks or refusals, got %q", *sortBy)
	case *interval <= 0:
		return fmt.Errorf("--interval: must be positive, got %v", *interval)
	}
	n, err := loadgen.NewNode(*addr, tlsFlags.config())
	if err != nil {
		return err
	}
	defer n.Close()
	read := func() (status.View, error) {
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		v, err := n.Top(ctx, *rows)
		if err != nil {
			err = wrongPort(ctx, err, "rlnode top", *addr, nodeport.HTTP, tlsFlags.config())
		}
		return v, err
	}
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	for {
		v, err := read()
		if errors.Is(err, nodeport.ErrWrongPort) {
			return err // it names rlnode top; no redraw would mend it
		}
		if *once {
			if err != nil {
				return fmt.Errorf("top: %w", err)
			}
			return writeTop(stdout, v, *sortBy, *rows)
		}
		io.WriteString(stdout, clearScreen)
		if err != nil {
			fmt.Fprintf(stdout, "%s  top: %v\n", time.Now().Format(time.TimeOnly), err) // shown, and tried again
		} else if err := writeTop(stdout, v, *sortBy, *rows); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil // interrupted: the way to leave
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// topRow is one key of rlnode top's table.
type topRow struct {
	limit string
	key   top.Key
}

// writeTop writes v as rlnode top shows it: the cluster's totals, each
// member's, then the keys ordered by sortBy, at most rows of them.
func writeTop(w io.Writer, v status.View, sortBy string, rows int) error {
	fmt.Fprintf(w, "cluster  %.1f checks/s  %.1f refusals/s  over %.1fs", v.ChecksPerSecond, v.RefusalsPerSecond, v.Seconds)
	if v.KeysHidden {
		fmt.Fprint(w, "  (keys hidden)")
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tSTATE\tSHARE\tCHECKS/S\tREFUSALS/S\tREPL LAG")
	for _, n := range v.Nodes {
		if n.Error != "" {
			fmt.Fprintf(tw, "%s\t%s\t%.1f%%\t-\t-\t-\t(%s)\n", n.Name, n.State, 100*n.Share, n.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f%%\t%.1f\t%.1f\t%v\n", n.Name, n.State, 100*n.Share, n.ChecksPerSecond, n.RefusalsPerSecond,
			time.Duration(n.ReplicationLagSeconds*float64(time.Second)).Round(time.Millisecond))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var keys []topRow
	for _, l := range v.Limits {
		list := l.Hot
		if sortBy == "refusals" {
			list = l.Refused
		}
		for _, k := range list {
			keys = append(keys, topRow{l.Name, k})
		}
	}
	rate := func(r topRow) float64 { return r.key.ChecksPerSecond }
	if sortBy == "refusals" {
		rate = func(r topRow) float64 { return r.key.RefusalsPerSecond }
	}
	slices.SortStableFunc(keys, func(a, b topRow) int { return cmp.Compare(rate(b), rate(a)) })
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LIMIT\tKEY\tCHECKS/S\tREFUSALS/S")
	for _, r := range keys[:min(len(keys), rows)] {
		key := r.key.Key
		if r.key.Truncated {
			key += "…"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\n", printable(r.limit), printable(key), r.key.ChecksPerSecond, r.key.RefusalsPerSecond)
	}
	if len(keys) == 0 {
		fmt.Fprintln(tw, "(no checks in the last interval)")
	}
	return tw.Flush()
}

// printable quotes s if it holds anything a terminal would act on rather
// than show (keys are the clients', and may hold escape sequences).
func printable(s string) string {
	if strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f || (r >= 0x80 && r < 0xa0) }) {
		return fmt.Sprintf("%q", s)
	}
	return s
}
