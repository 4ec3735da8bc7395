package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/snapshot"
)

// snapshotDirs gives every node its own --snapshot-dir, named after it, so
// that a node started again under its name finds its snapshot, as a
// StatefulSet's pod finds its volume. It returns the directory of a name
// too.
func snapshotDirs(t *testing.T) (nodeArgs func(name string) []string, dirOf func(name string) string) {
	base := t.TempDir()
	dirOf = func(name string) string { return filepath.Join(base, name) }
	return func(name string) []string { return []string{"--snapshot-dir", dirOf(name)} }, dirOf
}

// stopAllAtOnce signals every node with sig at once, as helm uninstall
// or a zone outage does, and waits for all to exit.
func stopAllAtOnce(t *testing.T, c *testCluster, sig syscall.Signal) {
	t.Helper()
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Go(func() { n.signal(t, sig) })
	}
	wg.Wait()
	for _, n := range c.nodes {
		if !n.wait(shutdownTimeout + 5*time.Second) {
			t.Fatalf("%s did not exit within %v of %v", n.name, shutdownTimeout+5*time.Second, sig)
		}
		t.Logf("%s exited: %v", n.name, n.waitErr)
	}
}

// restartAll starts every node again under its name, on new ports (as
// pods get new IPs), each joining the first one started, and waits until
// they have converged.
func restartAll(c *testCluster) {
	for i := range c.nodes {
		c.replace(i)
	}
	c.waitConverged(len(c.nodes))
}

// loadedSum returns the counters the nodes loaded from their snapshots.
func loadedSum(t *testing.T, c *testCluster) float64 {
	t.Helper()
	sum := 0.0
	for _, n := range c.nodes {
		v, err := metric(n, "ringlimit_snapshot_counters_loaded_total")
		if err != nil {
			t.Fatal(err)
		}
		sum += v
	}
	return sum
}

// TestWholeClusterStopKeepsCounters: three nodes, 600 counters half
// spent, all three stopped at once with SIGTERM (helm uninstall), then
// started again from their snapshot directories under the same names at
// new addresses: at least 99% of the counters are found half spent,
// through every node. The snapshot interval is an hour, so only the final
// snapshot each node writes as it shuts down can have kept them: while
// all three leave at once, each hands its counters to the others, which
// are leaving too, and keeps every counter it handed off in its own
// final snapshot.
func TestWholeClusterStopKeepsCounters(t *testing.T) {
	nodeArgs, dirOf := snapshotDirs(t)
	c := startClusterWith(t, 3, nodeArgs, "--snapshot-interval", "1h")
	spend(t, c.nodes[0])

	start := time.Now()
	stopAllAtOnce(t, c, syscall.SIGTERM)
	t.Logf("all three stopped %v after the SIGTERMs", time.Since(start).Round(time.Millisecond))
	for _, n := range c.nodes {
		if code := n.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("%s exited with %v, want 0", n.name, n.cmd.ProcessState)
		}
		if !strings.Contains(n.out.String(), "final snapshot written") {
			t.Errorf("%s logged no final snapshot", n.name)
		}
		if _, err := os.Stat(filepath.Join(dirOf(n.name), snapshot.FileName)); err != nil {
			t.Errorf("%s: %v", n.name, err)
		}
	}

	restartAll(c)
	took := pollKept(t, "after all 3 were stopped at once and started from their snapshots", c.nodes...)
	t.Logf("counters found %v after the restart converged; %v loaded from the snapshots", took.Round(time.Millisecond), loadedSum(t, c))
	if loaded := loadedSum(t, c); loaded < counters {
		t.Errorf("the nodes loaded %v counters, want at least the %d spent", loaded, counters)
	}
}

// TestWholeClusterKillKeepsCounters: the same after kill -9 of all three,
// which writes no final snapshot. A SIGKILL loses the hits admitted after
// the last periodic snapshot began: at most one --snapshot-interval of
// them (plus one write's time). So once every node has written a snapshot
// that began after the spending (which takes at most one interval and a
// write), all three are killed, and every counter must come back half
// spent. A key spent once more just before the kill, within the interval
// that may be lost, comes back either with that hit or without it.
func TestWholeClusterKillKeepsCounters(t *testing.T) {
	const interval = time.Second
	nodeArgs, _ := snapshotDirs(t)
	c := startClusterWith(t, 3, nodeArgs, "--snapshot-interval", interval.String())
	spend(t, c.nodes[0])
	spent := time.Now()
	took := poll(t, 3*interval+keepTimeout, "every node writes a snapshot begun after the spending", func() (bool, string) {
		var status []string
		for _, n := range c.nodes {
			at, err := metric(n, "ringlimit_snapshot_last_written_timestamp_seconds")
			if err != nil {
				return false, err.Error()
			}
			if at < float64(spent.UnixNano())/1e9 {
				return false, fmt.Sprintf("%s last wrote a snapshot begun at %v, before the spending ended at %v", n.name, at, spent)
			}
			status = append(status, n.name)
		}
		return true, fmt.Sprint(status)
	})
	t.Logf("every node wrote a snapshot begun after the spending, %v after it (bound: one interval, %v, and a write)", took.Round(time.Millisecond), interval)
	late := &pb.CheckItem{Name: "late", Key: "late", Limit: counterLimit, DurationMs: hour}
	if r, err := check(c.nodes[0], late); err != nil || r.Status != pb.Status_UNDER_LIMIT {
		t.Fatalf("spending the late key: %v %v", r, err)
	}

	stopAllAtOnce(t, c, syscall.SIGKILL)
	restartAll(c)
	took = pollKept(t, "after all 3 were killed with SIGKILL and started from their snapshots", c.nodes...)
	t.Logf("counters found %v after the restart converged", took.Round(time.Millisecond))
	r, err := check(c.nodes[1], &pb.CheckItem{Name: late.Name, Key: late.Key, Limit: late.Limit, DurationMs: late.DurationMs, Hits: ptr(int64(0))})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the key spent within the last interval came back with %d of %d remaining", r.Remaining, counterLimit)
	if r.Remaining != counterLimit-1 && r.Remaining != counterLimit {
		t.Errorf("the late key has %d remaining, want %d (its hit kept) or %d (lost with its interval)", r.Remaining, counterLimit-1, counterLimit)
	}
}

// TestCorruptSnapshotStartsEmpty: a node whose snapshot was corrupted
// while it was stopped (a byte flipped on disk) refuses the file, says so
// in its log and its metrics, moves the file aside, and starts empty and
// ready rather than crashing or loading what it cannot vouch for.
func TestCorruptSnapshotStartsEmpty(t *testing.T) {
	nodeArgs, dirOf := snapshotDirs(t)
	c := startClusterWith(t, 1, nodeArgs)
	spend(t, c.nodes[0])
	stopAllAtOnce(t, c, syscall.SIGTERM)
	path := filepath.Join(dirOf(c.nodes[0].name), snapshot.FileName)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0x04
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}

	restartAll(c) // waits until it is ready
	n := c.nodes[0]
	if !strings.Contains(n.out.String(), "snapshot refused") || !strings.Contains(n.out.String(), "reason=corrupt") {
		t.Errorf("%s did not log the refused snapshot:\n%s", n.name, n.out.Tail(4096))
	}
	if v, err := metric(n, "ringlimit_snapshot_load_errors_total", `reason="corrupt"`); err != nil || v != 1 {
		t.Errorf("ringlimit_snapshot_load_errors_total{reason=\"corrupt\"} = %v (%v), want 1", v, err)
	}
	if v, err := metric(n, "ringlimit_snapshot_counters_loaded_total"); err != nil || v != 0 {
		t.Errorf("ringlimit_snapshot_counters_loaded_total = %v (%v), want 0", v, err)
	}
	if full, s := keptAt(n, counterLimit); full != counters {
		t.Errorf("want every counter full, as on a node that starts empty: %s", s)
	}
	if _, err := os.Stat(path + ".refused"); err != nil {
		t.Errorf("the refused file was not kept aside: %v", err)
	}
}
