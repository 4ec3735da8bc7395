//go:build unix

package snapshot

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringlimit/ringlimit/limiter"
)

// TestLoadRefusesWhatIsNotARegularFile: a FIFO, a symbolic link (to a
// valid snapshot of this node, even) or a directory where the snapshot
// should be is refused at once, without reading it: Load returns, the log
// names the path and what is there, the refusal is counted as
// not_regular, the thing is moved aside, and the node's next snapshot is
// written as usual. (Issue 24: on main, Load waited on the FIFO for ever,
// followed the link and loaded what it points to, and read the directory
// as an I/O error.)
func TestLoadRefusesWhatIsNotARegularFile(t *testing.T) {
	_, _, valid := written(t, "n1", "a", "b", "c")
	for _, tc := range []struct {
		name, says string
		make       func(t *testing.T, path string)
	}{
		{"FIFO", "FIFO", func(t *testing.T, path string) {
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Skipf("mkfifo: %v", err)
			}
		}},
		{"symbolic link", "symbolic link", func(t *testing.T, path string) {
			target := filepath.Join(t.TempDir(), "elsewhere.snap")
			if err := os.WriteFile(target, valid, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
		}},
		{"directory", "directory", func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, FileName)
			tc.make(t, path)
			d := openDir(t, dir, "n1", limiter.New(limiter.Config{}))
			loaded := make(chan int, 1)
			go func() { loaded <- d.Load(context.Background(), intake) }()
			var n int
			select {
			case n = <-loaded:
			case <-time.After(10 * time.Second): // a bound for a test that failed, not a timing
				unblock(path)
				t.Fatalf("Load did not return: it waits on the %s", tc.name)
			}
			if n != 0 || d.store.Len() != 0 {
				t.Errorf("Load took %d counters, the store holds %d; want none", n, d.store.Len())
			}
			if got := testutil.ToFloat64(d.metrics.loadErrors.WithLabelValues("not_regular")); got != 1 {
				t.Errorf("load errors{reason=\"not_regular\"} = %v, want 1", got)
			}
			logs := d.logs.String()
			for _, want := range []string{"snapshot refused", "reason=not_regular", path, tc.says, "not a regular file"} {
				if !strings.Contains(logs, want) {
					t.Errorf("log does not say %q:\n%s", want, logs)
				}
			}
			if _, err := os.Lstat(path); !os.IsNotExist(err) {
				t.Errorf("the %s is still where the snapshot goes: %v", tc.name, err)
			}
			if _, err := os.Lstat(filepath.Join(dir, refusedName)); err != nil {
				t.Errorf("the %s was not moved aside to %s: %v", tc.name, refusedName, err)
			}
			spend(d.store, d.now, 1, "x")
			if err := d.Write(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
}

// unblock opens the FIFO at path for writing and closes it, which ends a
// read that waits on it, so that a failed test leaves no goroutine stuck.
func unblock(path string) {
	if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
		f.Close()
	}
}
