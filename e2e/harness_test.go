package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/internal/syncbuf"
)

// Timeouts shared by the tests.
const (
	convergeTimeout = 20 * time.Second
	shutdownTimeout = 10 * time.Second // --shutdown-timeout of every node
	rpcTimeout      = 5 * time.Second  // one check RPC or HTTP request
	pollInterval    = 50 * time.Millisecond
	hour            = int64(3_600_000) // duration_ms of every limit
	// year is the duration_ms of a fixed window that must not roll over
	// during a test: a window of the clock hour would at every hour, and a
	// test run across it would find its counters back to full.
	year = int64(365 * 24 * 3_600_000)
)

// node is one rlnode process this test started.
type node struct {
	name                     string
	http, grpc, peer, gossip string // host:port, all on 127.0.0.1
	client                   *client.Client
	cmd                      *exec.Cmd
	out                      *syncbuf.Buffer // stdout and stderr
	done                     chan struct{}
	exitedAt                 time.Time // set before done is closed
	waitErr                  error     // set before done is closed
}

// exited reports whether the process has ended.
func (n *node) exited() bool {
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process, which this test started. It does
// nothing once the process has been reaped.
func (n *node) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if n.exited() {
		return
	}
	if err := n.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("%s: signal %v: %v", n.name, sig, err)
	}
}

// freeze stops n with SIGSTOP and returns what thaws it with SIGCONT, at
// most once; the test's end thaws it too, before the nodes are stopped.
func (n *node) freeze(t testing.TB) (thaw func()) {
	n.signal(t, syscall.SIGSTOP)
	var once sync.Once
	thaw = func() { once.Do(func() { n.signal(t, syscall.SIGCONT) }) }
	t.Cleanup(thaw)
	return thaw
}

// wait waits up to d for the process to exit and reports whether it did.
func (n *node) wait(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-n.done:
		return true
	case <-timer.C:
		return false
	}
}

// testCluster is rlnode processes that join the first one.
type testCluster struct {
	t     testing.TB
	args  []string // extra flags of every node
	nodes []*node
	// nodeArgs, if not nil, returns extra flags of the node of a name,
	// the same whenever a node of that name starts (e.g. its own
	// --snapshot-dir, as a pod keeps its volume).
	nodeArgs func(name string) []string
	// bins, if not nil, names the binary a node of a name starts from
	// when it is not this version's (a rolling upgrade's older nodes);
	// the test may change it between starts.
	bins map[string]string
}

// startCluster starts n nodes, each but the first joining the first, and
// waits until every node is ready and lists n alive members. The nodes are
// stopped when the test ends, and their output is logged if it failed.
func startCluster(t testing.TB, n int, args ...string) *testCluster {
	t.Helper()
	return startClusterWith(t, n, nil, args...)
}

// startClusterWith is startCluster with flags of each node's own.
func startClusterWith(t testing.TB, n int, nodeArgs func(name string) []string, args ...string) *testCluster {
	t.Helper()
	if rlnodeBin == "" {
		t.Skip("e2e tests need the rlnode binary; skipped in -short mode")
	}
	c := &testCluster{t: t, args: args, nodeArgs: nodeArgs}
	c.startAll(n)
	return c
}

// startAll starts n nodes, each but the first joining the first, and waits
// until every node is ready and lists n alive members, as startCluster
// says.
func (c *testCluster) startAll(n int) {
	t := c.t
	t.Helper()
	t.Cleanup(c.stopAll)
	start := time.Now()
	for range n {
		c.add()
	}
	c.waitConverged(n)
	t.Logf("%d nodes started and converged in %v", n, time.Since(start).Round(time.Millisecond))
}

// add starts one more node, joining the first, and waits until it answers
// HTTP; it does not wait for the cluster to converge.
func (c *testCluster) add() *node {
	c.t.Helper()
	n := c.startRetrying(fmt.Sprintf("e2e-%d", len(c.nodes)))
	c.nodes = append(c.nodes, n)
	return n
}

// replace starts a new process under the name of nodes[i], which has
// exited, on new ports (as a restarted pod gets a new IP), joining a
// running node.
func (c *testCluster) replace(i int) *node {
	c.t.Helper()
	if old := c.nodes[i]; old.client != nil {
		old.client.Close()
	}
	n := c.startRetrying(c.nodes[i].name)
	c.nodes[i] = n
	return n
}

// restartInPlace starts a new process under the name of nodes[i], which
// has exited, on its ports (as a container restarted in its pod keeps
// the pod's IP), joining a running node.
func (c *testCluster) restartInPlace(i int) *node {
	c.t.Helper()
	old := c.nodes[i]
	if old.client != nil {
		old.client.Close()
	}
	n, err := c.startOn(old.name, old.http, old.grpc, old.peer, old.gossip)
	if err != nil {
		c.t.Fatalf("starting %s again on its ports: %v\n%s", old.name, err, n.out)
	}
	c.nodes[i] = n
	return n
}

// startRetrying starts a node named name, on other ports if another
// process takes one of its ports first.
func (c *testCluster) startRetrying(name string) *node {
	c.t.Helper()
	var lastOut string
	for attempt := 0; attempt < 3; attempt++ {
		n, err := c.start(name)
		if err == nil {
			return n
		}
		if !strings.Contains(n.out.String(), "address already in use") {
			c.t.Fatalf("starting %s: %v\n%s", n.name, err, n.out)
		}
		// Another process took one of the free ports between our check
		// and the node's bind: try other ports.
		lastOut = n.out.String()
	}
	c.t.Fatalf("starting %s: ports kept being taken:\n%s", name, lastOut)
	return nil
}

func (c *testCluster) start(name string) (*node, error) {
	ports := freePorts(c.t, 4)
	return c.startOn(name, loopback(ports[0]), loopback(ports[1]), loopback(ports[2]), loopback(ports[3]))
}

// startOn starts a node named name on the given host:ports.
func (c *testCluster) startOn(name, httpAddr, grpcAddr, peerAddr, gossipAddr string) (*node, error) {
	n := &node{
		name:   name,
		http:   httpAddr,
		grpc:   grpcAddr,
		peer:   peerAddr,
		gossip: gossipAddr,
	}
	var join []string
	if running := c.running(); len(running) > 0 {
		join = []string{"--join", running[0].gossip}
	}
	return n, c.exec(n, join...)
}

// exec starts n's process on n's ports, with the flags of every node and
// extra, and waits until it answers HTTP.
func (c *testCluster) exec(n *node, extra ...string) error {
	n.out, n.done = &syncbuf.Buffer{}, make(chan struct{})
	args := []string{
		"--node-name", n.name,
		"--http-addr", n.http,
		"--grpc-addr", n.grpc,
		"--peer-addr", n.peer,
		"--gossip-addr", n.gossip,
		"--advertise-addr", "127.0.0.1",
		"--shutdown-timeout", shutdownTimeout.String(),
	}
	args = append(args, extra...)
	args = append(args, c.args...)
	if c.nodeArgs != nil {
		args = append(args, c.nodeArgs(n.name)...)
	}
	bin := rlnodeBin
	if b, ok := c.bins[n.name]; ok {
		bin = b
	}
	n.cmd = exec.Command(bin, args...)
	n.cmd.Stdout, n.cmd.Stderr = n.out, n.out
	n.cmd.SysProcAttr = sysProcAttr()
	if err := n.cmd.Start(); err != nil {
		close(n.done)
		return err
	}
	go func() {
		err := n.cmd.Wait()
		n.exitedAt, n.waitErr = time.Now(), err
		close(n.done)
	}()

	// Wait for the HTTP listener; a node that exits meanwhile failed to
	// start (a port taken, a bad flag).
	deadline := time.Now().Add(convergeTimeout)
	for {
		if code, _, err := httpGet(n.http + "/healthz"); err == nil && code == http.StatusOK {
			break
		}
		if n.exited() {
			return fmt.Errorf("exited during start-up: %v", n.waitErr)
		}
		if time.Now().After(deadline) {
			n.cmd.Process.Kill()
			<-n.done
			return fmt.Errorf("no HTTP answer within %v", convergeTimeout)
		}
		time.Sleep(pollInterval / 2) // polling interval
	}
	cl, err := client.New(n.grpc)
	if err != nil {
		c.t.Fatalf("%s: gRPC client: %v", n.name, err)
	}
	n.client = cl
	return nil
}

// stopAll stops every node that still runs: SIGTERM, a wait of up to the
// shutdown timeout and a little, then SIGKILL. If the test failed,
// it logs every node's output.
func (c *testCluster) stopAll() {
	start := time.Now()
	defer func() { c.t.Logf("nodes stopped in %v", time.Since(start).Round(time.Millisecond)) }()
	// One at a time, newest first: nodes that all leave at once cannot
	// deliver their leave messages to each other, and each would wait out
	// memberlist's leave timeout (5 s).
	for _, n := range slices.Backward(c.nodes) {
		n.signal(c.t, syscall.SIGTERM)
		if !n.wait(shutdownTimeout + 5*time.Second) {
			c.t.Errorf("%s did not exit within %v of SIGTERM; killing it", n.name, shutdownTimeout+5*time.Second)
			n.signal(c.t, syscall.SIGKILL)
			<-n.done
		}
		if n.client != nil {
			n.client.Close()
		}
	}
	if c.t.Failed() {
		for _, n := range c.nodes {
			c.t.Logf("----- output of %s (http %s, grpc %s, peer %s, gossip %s) -----\n%s",
				n.name, n.http, n.grpc, n.peer, n.gossip, n.out.Tail(64<<10))
		}
	}
}

// running returns the nodes whose processes have not exited.
func (c *testCluster) running() []*node {
	var out []*node
	for _, n := range c.nodes {
		if !n.exited() {
			out = append(out, n)
		}
	}
	return out
}

// waitConverged waits until every running node is ready and lists exactly
// the running nodes as its alive members, want of them.
func (c *testCluster) waitConverged(want int) time.Duration {
	c.t.Helper()
	return poll(c.t, convergeTimeout, fmt.Sprintf("%d nodes converge", want), func() (bool, string) {
		nodes := c.running()
		var names []string
		for _, n := range nodes {
			names = append(names, n.name)
		}
		slices.Sort(names)
		if len(nodes) != want {
			return false, fmt.Sprintf("%d nodes running, want %d", len(nodes), want)
		}
		var status []string
		ok := true
		for _, n := range nodes {
			code, _, err := httpGet(n.http + "/readyz")
			if err != nil || code != http.StatusOK {
				ok = false
				status = append(status, fmt.Sprintf("%s: readyz %d %v", n.name, code, err))
				continue
			}
			ms, err := members(n)
			if err != nil {
				ok = false
				status = append(status, fmt.Sprintf("%s: %v", n.name, err))
				continue
			}
			alive := aliveNames(ms)
			if !slices.Equal(alive, names) {
				ok = false
			}
			status = append(status, fmt.Sprintf("%s sees alive %v", n.name, alive))
		}
		return ok, strings.Join(status, "; ")
	})
}

// poll calls cond every pollInterval until it reports true, and returns how
// long that took. After timeout it fails the test with cond's last status.
func poll(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	return pollOr(t, timeout, what, cond, t.Fatalf)
}

// pollOr is poll, failing the test with fatal (the chaos suite's records
// the message for the test's last lines).
func pollOr(t testing.TB, timeout time.Duration, what string, cond func() (bool, string), fatal func(format string, args ...any)) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		ok, status := cond()
		if ok {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			fatal("%s: not done within %v: %s", what, timeout, status)
		}
		time.Sleep(pollInterval) // polling interval, not waiting for an effect
	}
}

// usedPorts are the ports this process has handed out, so that two nodes
// never get the same one even after the first has exited.
var usedPorts = struct {
	sync.Mutex
	m map[int]bool
}{m: map[int]bool{}}

// freePorts returns n distinct loopback ports that are free for TCP and
// for UDP (memberlist binds both on its port).
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	usedPorts.Lock()
	defer usedPorts.Unlock()
	var ports []int
	var held []io.Closer
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries > 100 {
			t.Fatalf("found only %d free loopback ports in 100 tries", len(ports))
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listen on loopback: %v", err)
		}
		held = append(held, l)
		port := l.Addr().(*net.TCPAddr).Port
		if usedPorts.m[port] {
			continue
		}
		u, err := net.ListenPacket("udp", loopback(port))
		if err != nil {
			continue // UDP port taken: not usable for gossip
		}
		held = append(held, u)
		usedPorts.m[port] = true
		ports = append(ports, port)
	}
	return ports
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// check sends one item to n over gRPC with a deadline. An RPC error, a
// wrong number of results or a per-item error is an error.
func check(n *node, item *pb.CheckItem) (*pb.CheckResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	resp, err := n.client.Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
	if err != nil {
		return nil, fmt.Errorf("%s: check %s: %w", n.name, item.Key, err)
	}
	if len(resp.Responses) != 1 {
		return nil, fmt.Errorf("%s: check %s: %d results for 1 item", n.name, item.Key, len(resp.Responses))
	}
	r := resp.Responses[0]
	if r.Error != "" {
		return r, fmt.Errorf("%s: check %s: item error %v: %s", n.name, item.Key, r.ErrorCode, r.Error)
	}
	return r, nil
}

// checkMany sends items to n in one request with a deadline and returns
// the results in order. Per-item errors are the caller's to inspect.
func checkMany(n *node, items []*pb.CheckItem) ([]*pb.CheckResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	resp, err := n.client.Check(ctx, &pb.CheckRequest{Requests: items})
	if err != nil {
		return nil, fmt.Errorf("%s: check %d items: %w", n.name, len(items), err)
	}
	if len(resp.Responses) != len(items) {
		return nil, fmt.Errorf("%s: check: %d results for %d items", n.name, len(resp.Responses), len(items))
	}
	return resp.Responses, nil
}

// tally counts the outcomes of many concurrent checks, keeping a few
// error samples. It is safe for concurrent use.
type tally struct {
	mu        sync.Mutex
	admitted  int
	refused   int
	errors    int
	samples   []string
	decidedBy map[string]int // result metadata decided_by ("" if none) -> count
}

func (tl *tally) add(r *pb.CheckResult, err error) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if err != nil {
		tl.errors++
		if len(tl.samples) < 5 {
			tl.samples = append(tl.samples, err.Error())
		}
		return
	}
	if tl.decidedBy == nil {
		tl.decidedBy = map[string]int{}
	}
	tl.decidedBy[r.Metadata["decided_by"]]++
	switch r.Status {
	case pb.Status_UNDER_LIMIT:
		tl.admitted++
	default:
		tl.refused++
	}
}

func (tl *tally) String() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return fmt.Sprintf("admitted %d, refused %d, errors %d %q, decided_by %v",
		tl.admitted, tl.refused, tl.errors, tl.samples, tl.decidedBy)
}

// burst sends total one-hit checks of item from workers goroutines, the
// goroutines spread round-robin over nodes, and tallies the outcomes.
func burst(nodes []*node, item *pb.CheckItem, total, workers int) *tally {
	tl := &tally{}
	var wg sync.WaitGroup
	for w := range workers {
		n := nodes[w%len(nodes)]
		count := total / workers
		if w < total%workers {
			count++
		}
		wg.Go(func() {
			for range count {
				tl.add(check(n, item))
			}
		})
	}
	wg.Wait()
	return tl
}

func ptr[T any](v T) *T { return &v }
