package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringlimit/ringlimit/internal/syncbuf"
)

const (
	goodA = "domain: a\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n"
	goodB = "domain: b\n"
	// broken names an unknown key on line 3.
	broken = "domain: c\ndescriptors:\n  - kee: k\n"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func newTestReloader(t *testing.T, path string, logs *syncbuf.Buffer) (*Reloader, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	r, err := NewReloader(ReloaderConfig{Path: path, Debounce: 50 * time.Millisecond, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return r, reg
}

// TestReloaderLoop drives the debounce loop with fake events in a synctest
// bubble: a burst of events reloads once, after the quiet period; a broken
// file is logged with file, line and field, counted, and the old policies
// stay in force.
func TestReloaderLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "p.yaml")
		writeFile(t, path, goodA)
		var logs syncbuf.Buffer
		r, _ := newTestReloader(t, path, &logs)
		events, errs := make(chan fsnotify.Event), make(chan error)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- r.loop(ctx, events, errs) }()

		writeFile(t, path, goodB)
		for range 3 {
			events <- fsnotify.Event{Name: path, Op: fsnotify.Write}
			time.Sleep(30 * time.Millisecond) // under the debounce: no reload yet
		}
		synctest.Wait()
		if got := testutil.ToFloat64(r.loads); got != 1 {
			t.Fatalf("reloaded during a burst: %v loads", got)
		}
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		if got := testutil.ToFloat64(r.loads); got != 2 || !r.Policies().HasDomain("b") {
			t.Fatalf("after the burst: %v loads, domain b %v", got, r.Policies().HasDomain("b"))
		}

		writeFile(t, path, broken)
		events <- fsnotify.Event{Name: path, Op: fsnotify.Write}
		errs <- errors.New("queue overflow") // logged, not fatal
		time.Sleep(time.Second)
		synctest.Wait()
		if got := testutil.ToFloat64(r.errors); got != 1 {
			t.Errorf("%v reload errors, want 1", got)
		}
		if !r.Policies().HasDomain("b") || r.Policies().HasDomain("c") {
			t.Error("a broken file replaced the policies in force")
		}
		if !strings.Contains(logs.String(), "p.yaml:3: descriptors[0].kee: unknown key") {
			t.Errorf("log does not name file, line and field:\n%s", logs.String())
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("loop = %v", err)
		}
	})
}

// TestReloaderConfigMap runs the real watcher on a directory laid out as
// Kubernetes mounts a ConfigMap (files are symlinks through ..data, and an
// update swaps ..data), and polls, with a deadline, for the reload.
func TestReloaderConfigMap(t *testing.T) {
	dir := t.TempDir()
	mount := func(gen, content string) {
		t.Helper()
		data := filepath.Join(dir, gen)
		if err := os.Mkdir(data, 0o700); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(data, "p.yaml"), content)
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(gen, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	mount("..gen1", goodA)
	if err := os.Symlink("..data/p.yaml", filepath.Join(dir, "p.yaml")); err != nil {
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	r, reg := newTestReloader(t, dir, &logs)
	if !r.Policies().HasDomain("a") {
		t.Fatal("initial load missed domain a")
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v", err)
		}
	}()

	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; logs:\n%s", what, logs.String())
			}
		}
	}
	// The watch starts inside Run: swap again, well after the debounce,
	// until the reloader has seen a swap.
	gen, last := 2, time.Time{}
	waitFor("the swap to domain b", func() bool {
		if time.Since(last) > 500*time.Millisecond {
			mount("..gen"+strconv.Itoa(gen), goodB)
			gen, last = gen+1, time.Now()
		}
		return r.Policies().HasDomain("b")
	})
	mount("..broken", broken)
	waitFor("the broken file to be rejected", func() bool { return testutil.ToFloat64(r.errors) >= 1 })
	if !r.Policies().HasDomain("b") {
		t.Error("the broken file replaced the policies in force")
	}
	if !strings.Contains(logs.String(), "p.yaml:3: descriptors[0].kee: unknown key") {
		t.Errorf("log does not name file, line and field:\n%s", logs.String())
	}
	if n, err := testutil.GatherAndCount(reg, "ringlimit_policy_reloads_total", "ringlimit_policy_reload_errors_total", "ringlimit_policy_domains"); err != nil || n != 3 {
		t.Errorf("metrics: %d, %v", n, err)
	}
}

func TestNewReloaderBroken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	writeFile(t, path, broken)
	if _, err := NewReloader(ReloaderConfig{Path: path}); err == nil || !strings.Contains(err.Error(), "p.yaml:3") {
		t.Errorf("NewReloader = %v, want the file's error", err)
	}
}

// TestReloaderLogsWhatItLoads: the load at start (and each reload) logs
// how many domains and policies are in force and names the first
// maxLogged of each, not all of a large set.
func TestReloaderLogsWhatItLoads(t *testing.T) {
	var y strings.Builder
	for i := range maxLogged + 2 {
		fmt.Fprintf(&y, "---\ndomain: d%02d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n", i)
	}
	path := filepath.Join(t.TempDir(), "p.yaml")
	writeFile(t, path, y.String())
	var logs syncbuf.Buffer
	newTestReloader(t, path, &logs)
	line := logs.String()
	for _, want := range []string{`msg="policies loaded"`, "domains=22 policies=22", `domain_names="d00,d01,`, `d19 (+2 more)"`, `refs="d00/k,d01/k,`, `d19/k (+2 more)"`} {
		if !strings.Contains(line, want) {
			t.Errorf("log lacks %q:\n%s", want, line)
		}
	}
	if strings.Contains(line, "d21") {
		t.Errorf("log names more than %d domains:\n%s", maxLogged, line)
	}
}
