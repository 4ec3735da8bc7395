package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// buildRLNode builds the rlnode of this repository for the test, or skips
// a -short run or one without redis-server.
func buildRLNode(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds rlnode and starts servers")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("needs redis-server (apt-get install redis-server)")
	}
	bin := filepath.Join(t.TempDir(), "rlnode")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/rlnode")
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/rlnode: %v\n%s", err, out)
	}
	return bin
}

// children lists the processes whose parent is this one, from /proc; nil
// where there is no /proc.
func children(t *testing.T) []string {
	t.Helper()
	if runtime.GOOS != "linux" {
		return nil
	}
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	me := strconv.Itoa(os.Getpid())
	var out []string
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // exited meanwhile
		}
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == me { // state, then ppid
			out = append(out, s)
		}
	}
	return out
}

// TestPlots runs the whole program, small: a warm-up, then every mode
// (client-before with the same build) at two levels in two rounds, each
// run bounded by a count it reaches long before its duration.
func TestPlots(t *testing.T) {
	bin := buildRLNode(t)
	out := t.TempDir()
	err := plots(t.Context(), []string{"-rlnode", bin, "-out", out, "-before", bin, "-concurrency", "1,2", "-rounds", "2", "-count", "200", "-duration", "1m"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if left := children(t); len(left) > 0 {
		t.Errorf("processes left running: %q", left)
	}
	res, err := readResults(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 2*2*len(modes) {
		t.Fatalf("%d runs, want %d", len(res.Runs), 2*2*len(modes))
	}
	for _, r := range res.Runs {
		rep, err := decodeReport(r.Report)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Requests != 200 || rep.Answered != 200 || rep.Errors != 0 || rep.CPUUsPerCheck == nil {
			t.Errorf("%s at %d: %s; want 200 checks answered, server CPU known", r.Mode, r.Concurrency, r.Report)
		}
	}
	for _, c := range charts {
		if _, err := os.Stat(filepath.Join(out, c.file)); err != nil {
			t.Error(err)
		}
	}
}

// cancelOnWrite cancels a context at the first line written to it.
type cancelOnWrite struct{ cancel context.CancelFunc }

func (c cancelOnWrite) Write(p []byte) (int, error) {
	c.cancel()
	return len(p), nil
}

// TestPlotsInterrupted cancels the program after its first run, as an
// interrupt does, and checks that it stopped every process it started.
func TestPlotsInterrupted(t *testing.T) {
	bin := buildRLNode(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out := t.TempDir()
	err := plots(ctx, []string{"-rlnode", bin, "-out", out, "-concurrency", "1,2", "-count", "200"}, cancelOnWrite{cancel})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("plots after an interrupt: %v, want context.Canceled", err)
	}
	if left := children(t); len(left) > 0 {
		t.Errorf("processes left running: %q", left)
	}
	if _, err := os.Stat(filepath.Join(out, "results.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("results.json after an interrupt: %v, want none", err)
	}
}
