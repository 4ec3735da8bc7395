package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/client"
)

func TestHelpListsCommands(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		var out strings.Builder
		err := run(context.Background(), args, env(nil), &out, io.Discard)
		if code := exitCode(err, io.Discard); code != 0 {
			t.Errorf("rlnode %s: exit %d (%v), want 0", strings.Join(args, " "), code, err)
		}
		for _, want := range []string{"check", "members", "bench", "policy", "version", "-http-addr", "Exit status"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("rlnode %s does not mention %q:\n%s", strings.Join(args, " "), want, out.String())
			}
		}
	}
	// -h among the serving flags prints the same usage, on stderr.
	var stderr strings.Builder
	err := run(context.Background(), []string{"--http-addr", ":0", "-h"}, env(nil), io.Discard, &stderr)
	if !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr.String(), "Commands:") {
		t.Errorf("rlnode --http-addr :0 -h: %v, printed %q", err, stderr.String())
	}
}

func TestHelpCommand(t *testing.T) {
	for cmd, want := range map[string]string{
		"check":   "Exit status: 0 allowed (UNDER_LIMIT) or settled, 1 refused (OVER_LIMIT), 2",
		"members": "-addr",
		"bench":   "-concurrency",
		"version": "Commands:",
	} {
		var out strings.Builder
		err := run(context.Background(), []string{"help", cmd}, env(nil), &out, io.Discard)
		if code := exitCode(err, io.Discard); code != 0 || !strings.Contains(out.String(), want) {
			t.Errorf("rlnode help %s: exit %d, printed %q; want 0 and %q", cmd, code, out.String(), want)
		}
	}
	err := run(context.Background(), []string{"help", "frobnicate"}, env(nil), io.Discard, io.Discard)
	if code := exitCode(err, io.Discard); code != 2 || !strings.Contains(err.Error(), "frobnicate") {
		t.Errorf("rlnode help frobnicate: exit %d, %v; want 2 naming the command", code, err)
	}
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "--version", "-version"} {
		var out strings.Builder
		if err := run(context.Background(), []string{arg}, env(nil), &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(out.String(), "rlnode ") || !strings.Contains(out.String(), runtime.Version()) {
			t.Errorf("rlnode %s printed %q", arg, out.String())
		}
	}
}

func TestFormatVersion(t *testing.T) {
	bi := &debug.BuildInfo{
		GoVersion: "go1.26.0",
		Main:      debug.Module{Path: "github.com/ringlimit/ringlimit", Version: "v1.2.3"},
		Settings: []debug.BuildSetting{
			{Key: "-trimpath", Value: "true"},
			{Key: "vcs.revision", Value: "f9bfc13aa"},
			{Key: "vcs.time", Value: "2026-11-23T10:00:00Z"},
			{Key: "vcs.modified", Value: "false"},
		},
	}
	want := `rlnode v1.2.3
  module    github.com/ringlimit/ringlimit
  revision  f9bfc13aa
  time      2026-11-23T10:00:00Z
  modified  false
  go        go1.26.0
`
	if got := formatVersion(bi); got != want {
		t.Errorf("formatVersion =\n%s\nwant\n%s", got, want)
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err     error
		code    int
		printed bool
	}{
		{nil, 0, false},
		{flag.ErrHelp, 0, false},
		{errRefused, 1, false},
		{fmt.Errorf("check: %w", errRefused), 1, false},
		{errors.New("--limit: bad"), 2, true},
		{fmt.Errorf("check localhost:1: %w", client.ErrInvalid), 2, true},
	} {
		var stderr strings.Builder
		if code := exitCode(tc.err, &stderr); code != tc.code || (stderr.Len() > 0) != tc.printed {
			t.Errorf("exitCode(%v) = %d, printed %q; want %d, printed %v", tc.err, code, stderr.String(), tc.code, tc.printed)
		}
	}
}

// TestCheckExitCodes runs `rlnode check` against a node: a script can
// tell allowed (0), refused (1) and errors (2) apart by the exit status.
func TestCheckExitCodes(t *testing.T) {
	_, grpcAddr, stop := startNode(t)
	defer stop()
	check := func(args ...string) (int, string) {
		var out strings.Builder
		err := run(context.Background(), append([]string{"check", "--addr", grpcAddr}, args...), env(nil), &out, io.Discard)
		return exitCode(err, io.Discard), out.String()
	}
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		output string // a substring of stdout
	}{
		{"allowed", []string{"--key", "k", "--limit", "1"}, 0, "ALLOWED  0 of 1 remaining"},
		{"refused", []string{"--key", "k", "--limit", "1"}, 1, "REFUSED  0 of 1 remaining"},
		{"refused, JSON", []string{"--key", "k", "--limit", "1", "--json"}, 1, `"status":"OVER_LIMIT"`},
		{"never", []string{"--key", "k2", "--limit", "1", "--hits", "2"}, 1, "never"},
		{"asking charges nothing", []string{"--key", "k", "--limit", "1", "--hits", "0", "--json"}, 0, `"remaining":0`},
		{"spaced", []string{"--key", "s", "--limit", "5", "--min-interval", "1m"}, 0, "ALLOWED  4 of 5 remaining"},
		{"spaced, too soon", []string{"--key", "s", "--limit", "5", "--min-interval", "1m"}, 1, "REFUSED  4 of 5 remaining"},
		// (full again in a minute, less the time since the check: no more is pinned)
		{"a spacing alone", []string{"--key", "s2", "--min-interval", "1m"}, 0, "ALLOWED  0 of 1 remaining, full again in "},
		{"a spacing alone, too soon", []string{"--key", "s2", "--min-interval", "1m", "--json"}, 1, `"limit":1`},
		{"borrowing: the guarantee", []string{"--key", "b", "--limit", "1", "--ceiling", "2", "--parent-key", "all", "--parent-limit", "10"}, 0, "ALLOWED  0 of 1 remaining"},
		{"borrowing", []string{"--key", "b", "--limit", "1", "--ceiling", "2", "--parent-key", "all", "--parent-limit", "10"}, 0, "; borrowed beyond the limit"},
		{"borrowing, JSON", []string{"--key", "b2", "--hits", "2", "--limit", "1", "--ceiling", "3", "--parent-key", "all", "--parent-limit", "10", "--json"}, 0, `"borrowed":true`},
		{"borrowing without a parent", []string{"--key", "b", "--limit", "1", "--ceiling", "2"}, 2, ""},
		{"missing --key", []string{"--limit", "1"}, 2, ""},
		{"bad flag", []string{"--key", "k", "--limit", "1", "--algorithm", "DICE"}, 2, ""},
		{"stray argument", []string{"--key", "k", "--limit", "1", "extra"}, 2, ""},
		{"invalid check", []string{"--key", "k", "--limit", "1", "--duration", "0s"}, 2, ""},
		{"unreachable", []string{"--key", "k", "--limit", "1", "--addr", "127.0.0.1:1", "--timeout", "2s"}, 2, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := check(tc.args...)
			if code != tc.code || !strings.Contains(out, tc.output) {
				t.Errorf("exit %d, printed %q; want %d and %q", code, out, tc.code, tc.output)
			}
		})
	}
}

func TestDescribe(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	for _, tc := range []struct {
		d    client.Decision
		want string
	}{
		{client.Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAt: now.Add(6 * time.Second)},
			"ALLOWED  9 of 10 remaining, full again in 6s"},
		{client.Decision{Limit: 2, ResetAt: now.Add(time.Minute), RetryAfter: 30 * time.Second},
			"REFUSED  0 of 2 remaining, full again in 1m0s; retry in 30s"},
		{client.Decision{Limit: 2, ResetAt: now, RetryAfter: client.Never},
			"REFUSED  0 of 2 remaining, full again in 0s; never: more hits than the limit holds"},
		{client.Decision{Allowed: true, Limit: 10, Remaining: 3, ResetAt: now.Add(time.Second), Delay: 200 * time.Millisecond},
			"ALLOWED  3 of 10 remaining, full again in 1s; wait 200ms before proceeding"},
		{client.Decision{Allowed: true, Limit: 6, Remaining: 5, ResetAt: now.Add(time.Second), DecidedBy: "fallback"},
			"ALLOWED  5 of 6 remaining, full again in 1s (decided by fallback)"},
	} {
		if got := describe(tc.d, now); got != tc.want {
			t.Errorf("describe = %q\nwant       %q", got, tc.want)
		}
	}
}

// TestCheckPeek: --hits 0 says what a check of 1 would get: admitted
// while a hit remains; on a spent key, refused now and admitted again by
// the time the counter is full. A peek charges nothing and exits 0.
func TestCheckPeek(t *testing.T) {
	_, grpcAddr, stop := startNode(t)
	defer stop()
	check := func(args ...string) (int, string) {
		var out strings.Builder
		err := run(context.Background(), append([]string{"check", "--addr", grpcAddr, "--key", "p", "--limit", "2", "--duration", "1h"}, args...),
			env(nil), &out, io.Discard)
		return exitCode(err, io.Discard), out.String()
	}
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		output []string // parts of stdout (the time to full runs on between checks)
	}{
		{"fresh", []string{"--hits", "0"}, 0, []string{"PEEK  2 of 2 remaining, full again in 0s: a check of 1 would be admitted"}},
		{"fresh, JSON", []string{"--hits", "0", "--json"}, 0, []string{`"admits_one":true`, `"status":"UNDER_LIMIT"`}},
		{"spend one", nil, 0, []string{"ALLOWED  1 of 2 remaining"}},
		{"one left", []string{"--hits", "0"}, 0, []string{"PEEK  1 of 2 remaining, full again in ", ": a check of 1 would be admitted"}},
		{"spend the other", nil, 0, []string{"ALLOWED  0 of 2 remaining"}},
		{"spent", []string{"--hits", "0"}, 0, []string{"PEEK  0 of 2 remaining, full again in ", ": a check of 1 would be refused now, and admitted again within "}},
		{"spent, JSON", []string{"--hits", "0", "--json"}, 0, []string{`"admits_one":false`, `"remaining":0`}},
		{"still spent: the peeks charged nothing", nil, 1, []string{"REFUSED  0 of 2 remaining"}},
	} {
		code, out := check(tc.args...)
		if code != tc.code {
			t.Errorf("%s: exit %d, want %d", tc.name, code, tc.code)
		}
		for _, part := range tc.output {
			if !strings.Contains(out, part) {
				t.Errorf("%s: printed %q, want %q", tc.name, out, part)
			}
		}
	}
}

// TestAddrOfTheOtherPort: rlnode check, members and top, each given
// every port of a node, say which port they reached and which they want,
// rather than the other protocol's error (check given the RESP port hung
// 5s; top given the gRPC port printed a malformed HTTP response). Their
// --timeout is long, so that a hang shows as a timeout, not as the port.
func TestAddrOfTheOtherPort(t *testing.T) {
	n, stop := startNamedNode(t, t.Name(), "--resp-addr", "127.0.0.1:0")
	defer stop()
	ports := map[string]string{"HTTP": n.HTTPAddr(), "gRPC": n.GRPCAddr(), "RESP (Redis protocol)": n.RESPAddr()}
	for _, tc := range []struct {
		cmd  []string
		want string // the port the command wants
	}{
		{[]string{"check", "--key", "k", "--limit", "1"}, "gRPC port (a node's --grpc-addr, default :8081)"},
		{[]string{"members"}, "HTTP port (a node's --http-addr, default :8080)"},
		{[]string{"top", "--once"}, "HTTP port (a node's --http-addr, default :8080)"},
		{[]string{"top"}, "HTTP port (a node's --http-addr, default :8080)"}, // live: it stops, as no redraw would mend it
	} {
		for port, addr := range ports {
			if strings.HasPrefix(tc.want, port) {
				continue
			}
			article := "a"
			if port == "HTTP" {
				article = "an"
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // ends a live top that would go on
			err := run(ctx, append(tc.cmd, "--addr", addr, "--timeout", "30s"), env(nil), io.Discard, io.Discard)
			cancel()
			want := fmt.Sprintf("%s: that is %s %s port; rlnode %s wants the %s", addr, article, port, tc.cmd[0], tc.want)
			if code := exitCode(err, io.Discard); code != 2 || err.Error() != want {
				t.Errorf("%s --addr <%s port>: exit %d, %v; want 2 and %q", tc.cmd[0], port, code, err, want)
			}
		}
	}
}

func TestDescribePeek(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	for _, tc := range []struct {
		d    client.Decision
		want string
	}{
		{client.Decision{Allowed: true, Limit: 10, Remaining: 3, ResetAt: now.Add(7 * time.Second)},
			"PEEK  3 of 10 remaining, full again in 7s: a check of 1 would be admitted"},
		{client.Decision{Allowed: true, Limit: 4, Remaining: 4, ResetAt: now.Add(time.Millisecond)},
			"PEEK  4 of 4 remaining, full again in 0s: a check of 1 would be admitted"},
		{client.Decision{Allowed: true, Limit: 2, ResetAt: now.Add(time.Minute)},
			"PEEK  0 of 2 remaining, full again in 1m0s: a check of 1 would be refused now, and admitted again within 1m0s at the latest"},
		{client.Decision{Allowed: true, Limit: 6, ResetAt: now.Add(time.Second), DecidedBy: "fallback"},
			"PEEK  0 of 6 remaining, full again in 1s: a check of 1 would be refused now, and admitted again within 1s at the latest (decided by fallback)"},
	} {
		if got := describePeek(tc.d, now); got != tc.want {
			t.Errorf("describePeek = %q\nwant           %q", got, tc.want)
		}
	}
}
