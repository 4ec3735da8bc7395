//go:build unix

package e2e

import (
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/ringlimit/ringlimit/snapshot"
)

// fifoSnapshotDirs is snapshotDirs with a FIFO named like a snapshot in
// each node's directory, as an attacker who can write there may leave.
func fifoSnapshotDirs(t *testing.T) func(name string) []string {
	nodeArgs, dirOf := snapshotDirs(t)
	made := map[string]bool{}
	return func(name string) []string {
		if !made[name] {
			made[name] = true
			dir := dirOf(name)
			if err := syscall.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(filepath.Join(dir, snapshot.FileName), 0o600); err != nil {
				t.Skipf("mkfifo: %v", err)
			}
		}
		return nodeArgs(name)
	}
}

// stopsOnSIGTERM sends n SIGTERM and fails the test unless it exits,
// with status 0, within the shutdown timeout: a node that ignores the
// signal is killed once that has passed.
func stopsOnSIGTERM(t *testing.T, n *node, when string) {
	t.Helper()
	n.signal(t, syscall.SIGTERM)
	if !n.wait(shutdownTimeout) { // a bound for a node that ignores the signal, not a timing
		t.Errorf("%s: no exit within %v of SIGTERM; killing it\n%s", when, shutdownTimeout, n.out.Tail(4096))
		n.signal(t, syscall.SIGKILL)
		<-n.done
		return
	}
	if code := n.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("%s: exited with %v, want 0\n%s", when, n.cmd.ProcessState, n.out.Tail(4096))
	}
}

// TestFIFOSnapshotAndSIGTERMAtStartUp: a FIFO named like the snapshot in
// a node's --snapshot-dir is skipped, not read: the node logs that the
// path is a FIFO, not a regular file, counts it, becomes ready and
// serves; and a SIGTERM stops it at once, whether it is ready or still
// at start-up, not yet joined (its --join answers no one). (Issue 24: on
// main the node waited on the FIFO for ever, never served, and ignored
// SIGTERM.)
func TestFIFOSnapshotAndSIGTERMAtStartUp(t *testing.T) {
	t.Run("ready", func(t *testing.T) {
		c := startClusterWith(t, 1, fifoSnapshotDirs(t)) // waits until the node is ready
		n := c.nodes[0]
		out := n.out.String()
		for _, want := range []string{"snapshot refused", "reason=not_regular", snapshot.FileName, "FIFO", "not a regular file"} {
			if !strings.Contains(out, want) {
				t.Errorf("the log does not say %q:\n%s", want, n.out.Tail(4096))
			}
		}
		if v, err := metric(n, "ringlimit_snapshot_load_errors_total", `reason="not_regular"`); err != nil || v != 1 {
			t.Errorf(`ringlimit_snapshot_load_errors_total{reason="not_regular"} = %v (%v), want 1`, v, err)
		}
		spend(t, n)
		stopsOnSIGTERM(t, n, "a ready node")
	})
	t.Run("not joined yet", func(t *testing.T) {
		nobody := loopback(freePorts(t, 1)[0]) // no gossip listens there
		c := &testCluster{t: t, args: []string{"--join", nobody}, nodeArgs: fifoSnapshotDirs(t)}
		t.Cleanup(c.stopAll)
		n := c.startRetrying("e2e-0") // returns once HTTP answers
		c.nodes = append(c.nodes, n)
		if code, _, err := httpGet(n.http + "/readyz"); err != nil || code != http.StatusServiceUnavailable {
			t.Fatalf("/readyz = %d (%v), want 503 while the node cannot join", code, err)
		}
		stopsOnSIGTERM(t, n, "a node at start-up, not joined")
		if out := n.out.String(); !strings.Contains(out, "shutting down") || !strings.Contains(out, "not joined yet") {
			t.Errorf("the log does not say it stopped at start-up:\n%s", n.out.Tail(4096))
		}
	})
}
