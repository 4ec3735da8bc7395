package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/ring"
)

// previousVersion is the commit of the version before this one's peer
// protocol: the last whose nodes served the Peer service only as
// ringlimit.v1.Peer, before it moved to internal/peerpb as
// ringlimit.peer.v1. When the peer protocol changes again, this becomes
// the last commit before that change, so that this test always runs the
// version a rolling upgrade starts from beside this one.
const previousVersion = "cfee9bdf73771b2c04a48e282ed02aab53fb44f9"

// previous is the rlnode binary of previousVersion, built once.
var previous struct {
	once sync.Once
	bin  string
	err  error
}

// previousRlnode returns the path of rlnode built from previousVersion's
// source, which it takes from this repository's history (a clone with its
// history, not a shallow one). It fails the test, naming the cause, when
// it cannot: a mixed-version cluster is what this test is for.
func previousRlnode(t *testing.T) string {
	t.Helper()
	if rlnodeBin == "" {
		t.Skip("e2e tests need the rlnode binary; skipped in -short mode")
	}
	previous.once.Do(func() { previous.bin, previous.err = buildPrevious() })
	if previous.err != nil {
		t.Fatalf("rlnode of the previous version (%s): %v", previousVersion[:12], previous.err)
	}
	return previous.bin
}

func buildPrevious() (string, error) {
	root, err := moduleDir()
	if err != nil {
		return "", err
	}
	if out, err := exec.Command("git", "-C", root, "cat-file", "-e", previousVersion+"^{commit}").CombinedOutput(); err != nil {
		return "", fmt.Errorf("commit not in this clone (a shallow clone? git fetch --unshallow): %v %s", err, out)
	}
	dir, err := os.MkdirTemp(filepath.Dir(rlnodeBin), "previous-")
	if err != nil {
		return "", err
	}
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", previousVersion)
	extract := exec.Command("tar", "-x", "-C", dir)
	if extract.Stdin, err = archive.StdoutPipe(); err != nil {
		return "", err
	}
	if err := extract.Start(); err != nil {
		return "", fmt.Errorf("tar: %w", err)
	}
	var stderr bytes.Buffer
	archive.Stderr = &stderr
	if err := archive.Run(); err != nil {
		return "", fmt.Errorf("git archive: %w %s", err, stderr.Bytes())
	}
	if err := extract.Wait(); err != nil {
		return "", fmt.Errorf("tar: %w", err)
	}
	bin := filepath.Join(dir, "rlnode-previous")
	build := exec.Command("go", "build", "-o", bin, "./cmd/rlnode")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return bin, nil
}

// TestRollingUpgrade: a cluster whose nodes are of this version and of the
// previous one, as during a rolling upgrade, forwards checks, hands
// counters off and takes over a crashed node's counters from its replicas
// in every direction between the two versions, and keeps every counter.
// Nodes e2e-0 and e2e-2 start as the previous version, e2e-1 as this one;
// then each is replaced by this version in turn.
func TestRollingUpgrade(t *testing.T) {
	prev := previousRlnode(t)
	c := &testCluster{t: t, bins: map[string]string{"e2e-0": prev, "e2e-2": prev}}
	c.startAll(3)
	old0, new1, old2 := c.nodes[0], c.nodes[1], c.nodes[2]

	// Forwards: through this version's node to owners of both versions,
	// then peeks through the previous version's.
	spend(t, new1)
	for _, n := range []*node{old0, old2} {
		if k, s := kept(n); k != counters {
			t.Fatalf("forwarded through %s: %s", n.name, s)
		}
	}
	// A sliding log: nothing refills within the hour (a token bucket
	// gives one hit back every 36s, and this test can run longer).
	item := &pb.CheckItem{Name: "upgrade", Key: "hot", Limit: 100, DurationMs: hour, Algorithm: pb.Algorithm_SLIDING_LOG}
	if tl := burst(c.nodes, item, 300, 30); tl.errors != 0 || tl.admitted != 100 {
		t.Fatalf("300 checks over both versions: %v; want exactly 100 admitted, no errors", tl)
	}

	// Replicas from this version to the previous: e2e-1 crashes, and its
	// heirs, of the previous version, take its counters over.
	replicated(t, new1)
	kill(t, new1)
	c.waitConverged(2)
	pollKept(t, "after this version's node was killed", old0, old2)

	// Hand-off from the previous version to this: e2e-1 comes back.
	c.replace(1)
	c.waitConverged(3)
	pollKept(t, "after this version's node came back", c.nodes[1], old0)

	// Hand-off from this version to the previous: e2e-1 leaves.
	stop(t, c.nodes[1])
	c.waitConverged(2)
	pollKept(t, "after this version's node left", old0, old2)

	// Replicas from the previous version to this: e2e-1 is back; then
	// e2e-2, of the previous version, crashes, and e2e-1 is among its
	// heirs, once e2e-2 has replicated its counters again after the ring
	// changed.
	c.replace(1)
	c.waitConverged(3)
	heirHoldsReplicas(t, c, c.nodes[1])
	replicated(t, old2)
	kill(t, old2)
	c.waitConverged(2)
	pollKept(t, "after the previous version's node was killed", old0, c.nodes[1])

	// The upgrade ends: e2e-2 comes back as this version, and e2e-0 is
	// stopped and replaced by this version.
	delete(c.bins, "e2e-2")
	c.replace(2)
	c.waitConverged(3)
	stop(t, old0)
	delete(c.bins, "e2e-0")
	c.waitConverged(2)
	c.replace(0)
	c.waitConverged(3)
	pollKept(t, "once every node is of this version", c.nodes...)
	for _, n := range c.nodes {
		if r, err := check(n, item); err != nil || r.Status != pb.Status_OVER_LIMIT {
			t.Errorf("%s: the spent hot key after the upgrade: %v, %v; want refused", n.name, r, err)
		}
	}
}

// heirHoldsReplicas waits until heir, a node that has just joined, keeps a
// replica of every counter (counterItem's keys) whose owner in the ring
// of c's running nodes would leave it to heir: it has every replica it
// needs to take over should any owner crash. (An owner's count of
// replicas sent does not say to whom they went.)
func heirHoldsReplicas(t *testing.T, c *testCluster, heir *node) {
	t.Helper()
	var members []ring.Member
	for _, n := range c.running() {
		members = append(members, ring.Member{Name: n.name})
	}
	r := ring.New(members...)
	want := 0
	for i := range counters {
		key := counterItem(i, 0).Key
		owner, _ := r.Owner(key)
		if h, _ := r.Without(owner.Name).Owner(key); owner.Name != heir.name && h.Name == heir.name {
			want++
		}
	}
	poll(t, keepTimeout, fmt.Sprintf("%s keeps the %d replicas it is heir to", heir.name, want), func() (bool, string) {
		held, err := metric(heir, "ringlimit_replicas")
		return err == nil && held >= float64(want), fmt.Sprintf("keeps %v, %v", held, err)
	})
}

// kill ends n with SIGKILL and waits for it to exit.
func kill(t *testing.T, n *node) {
	t.Helper()
	n.signal(t, syscall.SIGKILL)
	if !n.wait(5 * time.Second) {
		t.Fatalf("%s did not exit after SIGKILL", n.name)
	}
}

// stop ends n with SIGTERM, as a rolling restart does, and waits for it
// to leave and exit 0.
func stop(t *testing.T, n *node) {
	t.Helper()
	n.signal(t, syscall.SIGTERM)
	if !n.wait(shutdownTimeout + 5*time.Second) {
		t.Fatalf("%s did not exit within %v of SIGTERM", n.name, shutdownTimeout+5*time.Second)
	}
	if code := n.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("%s exited with %v after SIGTERM, want 0", n.name, n.cmd.ProcessState)
	}
}
