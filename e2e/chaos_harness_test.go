//go:build chaos

// The chaos suite runs only with -tags chaos (`go test -tags chaos
// -run Chaos ./e2e/`, as .ci/run does): it builds an image and runs
// minutes of containers, too slow for the README's `go test ./...`.

package e2e

import (
	"bytes"
	crand "crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/internal/testpki"
)

// Settings of every chaos cluster, as the Helm chart deploys one.
const (
	chaosGrace    = 30 * time.Second // --shutdown-timeout; docker stop waits longer
	chaosReady    = 60 * time.Second // a started node joins and is ready
	chaosKeys     = 500              // distinct keys of the load
	chaosLimit    = 40               // each key's limit per hour
	chaosWorkers  = 8                // load goroutines, one check in flight each
	chaosMaxCheck = 200_000          // bound on the checks of one load
)

// docker runs the docker CLI; the error carries its stderr.
func docker(args ...string) (string, error) {
	cmd := exec.Command("docker", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// requireDocker skips when there is no docker CLI or daemon: the suite
// runs containers and has nothing to test without them.
func requireDocker(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("skipped: no docker CLI on PATH; the chaos suite runs containers")
	}
	if _, err := docker("version", "--format", "{{.Server.Version}}"); err != nil {
		t.Skipf("skipped: the docker daemon does not answer (%v); the chaos suite runs containers", err)
	}
}

// chaosImage returns RINGLIMIT_IMAGE when set (.ci/run sets it to the
// image it has just built), else builds this tree's image under a tag of
// its own, removed when the test ends, so that concurrent runs never
// replace each other's image.
func chaosImage(t *testing.T, id string) string {
	t.Helper()
	if img := os.Getenv("RINGLIMIT_IMAGE"); img != "" {
		return img
	}
	root, err := moduleDir()
	if err != nil {
		fatalf(t, "%v", err)
	}
	img := "ringlimit:chaos-" + id
	out, err := exec.Command("make", "-C", root, "image", "IMAGE="+img).CombinedOutput()
	if err != nil {
		fatalf(t, "make image: %v\n%s", err, out)
	}
	t.Cleanup(func() { docker("image", "rm", img) })
	return img
}

// chaosCluster is a cluster of rlnode containers on a private network the
// test created, joined through one network alias shared by all (as
// through a headless Service), with mutual TLS between the nodes and
// encrypted gossip.
type chaosCluster struct {
	t        *testing.T
	id       string
	image    string
	network  string // the nodes' network: gossip and peer traffic
	clients  string // the network the test's load reaches the nodes on
	headless string // the shared alias; member names are <n>.<headless>
	prefix   string // of the nodes' network's /24, e.g. "10.214.7."
	cprefix  string // of the clients' network's /24
	pki      string // directory with node.crt, node.key, node-ca.crt
	key      string // gossip key, base64
	nodes    []*chaosNode
	args     []string // every node's flags besides the chart's
}

// chaosNode is one container. Its embedded node has the member name
// (its DNS name), the HTTP and gRPC addresses on the container's IP and a
// client; the process fields are unused.
type chaosNode struct {
	*node
	container, ip string // ip on the nodes' network
}

// startChaos starts n nodes, each with the flags args besides the
// chart's, and waits until each sees all n alive.
func startChaos(t *testing.T, n int, args ...string) *chaosCluster {
	t.Helper()
	recordFailures(t)
	requireDocker(t)
	b := make([]byte, 4)
	crand.Read(b)
	id := hex.EncodeToString(b)
	c := &chaosCluster{t: t, id: id, image: chaosImage(t, id), network: "ringlimit-chaos-" + id,
		clients: "ringlimit-chaos-clients-" + id, headless: "rl-" + id + ".chaos", args: args}
	c.prefix = c.createNetwork(c.network, 214)
	c.cprefix = c.createNetwork(c.clients, 215)

	// The cluster's CA and one certificate for every member name, as the
	// chart generates them; and a 32-byte gossip key.
	ca := testpki.NewCA(t, "ringlimit chaos CA")
	c.pki = t.TempDir()
	files := ca.Issue(t, "ringlimit chaos node", "*."+c.headless).Write(t, c.pki, "node", ca)
	for _, f := range []string{files.Cert, files.Key, files.CA} {
		if err := os.Chmod(f, 0o644); err != nil { // readable by the image's user, 65532
			fatalf(t, "%v", err)
		}
	}
	if err := os.Chmod(c.pki, 0o755); err != nil {
		fatalf(t, "%v", err)
	}
	key := make([]byte, 32)
	crand.Read(key)
	c.key = base64.StdEncoding.EncodeToString(key)

	for range n {
		c.add()
	}
	c.waitMembers(chaosReady)
	return c
}

// createNetwork creates a bridge network with a random /24 of
// 10.<second>.0.0/16, so nodes have fixed addresses the host can reach,
// removes it when the test ends (after the containers: cleanups run last
// in, first out) and returns the /24's prefix ("10.214.7.").
func (c *chaosCluster) createNetwork(name string, second int) string {
	var err error
	for range 8 {
		prefix := fmt.Sprintf("10.%d.%d.", second, rand.IntN(256))
		if _, err = docker("network", "create", "--driver", "bridge", "--subnet", prefix+"0/24", name); err == nil {
			c.t.Cleanup(func() { docker("network", "rm", name) })
			return prefix
		}
	}
	fatalf(c.t, "create network %s: %v", name, err)
	return ""
}

// add starts one more node, n<i>.<headless>, and returns it; it is ready
// once waitMembers says so.
func (c *chaosCluster) add() *chaosNode {
	t := c.t
	i := len(c.nodes)
	short := fmt.Sprintf("n%d", i)
	cn := &chaosNode{
		container: fmt.Sprintf("rl-chaos-%s-%d", c.id, i),
		ip:        fmt.Sprintf("%s%d", c.prefix, 10+i),
	}
	clientIP := fmt.Sprintf("%s%d", c.cprefix, 10+i)
	cn.node = &node{name: short + "." + c.headless, http: clientIP + ":8080", grpc: clientIP + ":8081"}
	t.Cleanup(func() {
		if d := os.Getenv("RINGLIMIT_CHAOS_LOGS"); d != "" {
			all, _ := exec.Command("docker", "logs", cn.container).CombinedOutput()
			if err := os.WriteFile(filepath.Join(d, cn.container+".log"), all, 0o644); err != nil {
				t.Logf("keeping the log of %s: %v", cn.container, err)
			}
		}
		if t.Failed() {
			logs, _ := exec.Command("docker", "logs", "--tail", "30", cn.container).CombinedOutput()
			t.Logf("docker logs %s:\n%s", cn.container, logs)
		}
		docker("rm", "--force", "--volumes", cn.container)
	})
	// Created on the nodes' network, connected to the clients' one, then
	// started: a network cut between nodes (partition) leaves the load's
	// path to every node intact.
	_, err := docker(append([]string{"create", "--name", cn.container, "--hostname", short,
		"--network", c.network, "--ip", cn.ip,
		"--network-alias", c.headless, "--network-alias", cn.name,
		"--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		"--volume", c.pki + ":/pki:ro",
		"--stop-timeout", fmt.Sprint(int(chaosGrace.Seconds()) + 15),
		"--env", "RLNODE_GOSSIP_KEY=" + c.key,
		c.image,
		"--node-name", cn.name,
		"--advertise-addr", cn.ip,
		"--join", c.headless + ":7946",
		"--bootstrap", "n0." + c.headless, // as the chart names pod 0
		"--peer-tls-cert", "/pki/node.crt", "--peer-tls-key", "/pki/node.key", "--peer-tls-ca", "/pki/node-ca.crt",
		"--shutdown-timeout", chaosGrace.String()}, c.args...)...)
	if err != nil {
		fatalf(t, "%v", err)
	}
	if _, err := docker("network", "connect", "--ip", clientIP, c.clients, cn.container); err != nil {
		fatalf(t, "%v", err)
	}
	if _, err := docker("start", cn.container); err != nil {
		fatalf(t, "%v", err)
	}
	cl, err := client.New(cn.grpc)
	if err != nil {
		fatalf(t, "%s: gRPC client: %v", cn.name, err)
	}
	t.Cleanup(func() { cl.Close() })
	cn.client = cl
	c.nodes = append(c.nodes, cn)
	return cn
}

// running lists the nodes whose container runs (not killed, stopped or
// paused by the test).
func (c *chaosCluster) running() []*chaosNode {
	var out []*chaosNode
	for _, n := range c.nodes {
		if s, err := docker("inspect", "--format", "{{.State.Status}}", n.container); err == nil && s == "running" {
			out = append(out, n)
		}
	}
	return out
}

// waitMembers waits until every running node is ready, sees exactly the
// running nodes alive and suspects none of them (its probes answer: see
// package heal), and returns how long that took. Gossip may see a member
// again before its peer port can be reached (after a partition, members
// find each other within a second, while connections across the cut are
// still timing out): the nodes see each other once both hold.
func (c *chaosCluster) waitMembers(timeout time.Duration) time.Duration {
	c.t.Helper()
	run := c.running()
	var want []string
	for _, n := range run {
		want = append(want, n.name)
	}
	slices.Sort(want)
	fatal := func(format string, args ...any) { c.t.Helper(); fatalf(c.t, format, args...) }
	return pollOr(c.t, timeout, "membership", func() (bool, string) {
		var status []string
		ok := true
		for _, n := range run {
			code, _, err := httpGet(n.http + "/readyz")
			ms, merr := members(n.node)
			got := aliveNames(ms)
			suspects, serr := metric(n.node, "ringlimit_suspect_owners")
			if err != nil || code != 200 || merr != nil || !slices.Equal(got, want) || serr != nil || suspects != 0 {
				ok = false
			}
			status = append(status, fmt.Sprintf("%s ready %d (%v) sees %v (%v), suspects %v (%v)", n.name, code, err, got, merr, suspects, serr))
		}
		return ok, strings.Join(status, "; ")
	}, fatal)
}

// chaosLoad drives checks from the host at the nodes it is told to use,
// as a Service sends to its ready endpoints, and counts outcomes per
// phase and per key. Each check names one of chaosKeys keys with a limit
// of chaosLimit an hour (SLIDING_LOG: nothing refills during a test), so
// the exact number of checks to admit is, over keys, min(answered,
// limit).
type chaosLoad struct {
	targets atomic.Pointer[[]*chaosNode]
	phase   atomic.Int32
	phases  []*chaosPhase
	stopped atomic.Bool
	wg      sync.WaitGroup

	mu    sync.Mutex
	byKey [chaosKeys]struct{ answered, admitted int }
	// admissions describes each key's admissions (when, in which phase,
	// through which node, decided by what), for a failure to show where
	// the cluster over-admitted.
	admissions [chaosKeys][]admission
}

// admission is one admitted check of the load, as over describes it.
type admission struct {
	at          time.Time
	phase, node string
	decidedBy   string
}

// over returns the keys that admitted more than bound, each with its
// admissions.
func (l *chaosLoad) over(bound int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for k, n := range l.byKey {
		if n.admitted > bound {
			lines := make([]string, len(l.admissions[k]))
			for i, a := range l.admissions[k] {
				lines[i] = fmt.Sprintf("%d at %s (%s), sent to %s, decided_by %q", i+1, a.at.UTC().Format("15:04:05.000"), a.phase, a.node, a.decidedBy)
			}
			out = append(out, fmt.Sprintf("key %d admitted %d:\n\t\t%s", k, n.admitted, strings.Join(lines, "\n\t\t")))
		}
	}
	return out
}

// chaosPhase counts the checks sent while the load was in one phase.
type chaosPhase struct {
	name    string
	tally   tally
	slowest atomic.Int64 // nanoseconds
	total   atomic.Int64 // nanoseconds, of all its checks
	// ownerless is when (Unix ns) the last of its checks decided without
	// the key's owner (decided_by failover or fallback) was answered; 0 if
	// none was.
	ownerless atomic.Int64
}

// startLoad starts chaosWorkers goroutines sending checks to targets
// until stop, d or chaosMaxCheck checks in all. The phases are named in
// order; next moves to the next one.
func startLoad(t *testing.T, id string, targets []*chaosNode, d time.Duration, phases ...string) *chaosLoad {
	l := &chaosLoad{}
	for _, p := range phases {
		l.phases = append(l.phases, &chaosPhase{name: p})
	}
	l.setTargets(targets)
	end := time.Now().Add(d)
	var sent atomic.Int64
	for w := range chaosWorkers {
		l.wg.Go(func() {
			for i := w; !l.stopped.Load() && time.Now().Before(end) && sent.Add(1) <= chaosMaxCheck; i++ {
				ts := *l.targets.Load()
				k := rand.IntN(chaosKeys)
				item := &pb.CheckItem{Name: "chaos", Key: fmt.Sprintf("%s:%d", id, k), Limit: chaosLimit,
					DurationMs: hour, Algorithm: pb.Algorithm_SLIDING_LOG}
				p := l.phases[l.phase.Load()]
				start := time.Now()
				r, err := check(ts[i%len(ts)].node, item)
				took := int64(time.Since(start))
				p.total.Add(took)
				for s := p.slowest.Load(); took > s && !p.slowest.CompareAndSwap(s, took); s = p.slowest.Load() {
				}
				p.tally.add(r, err)
				if by := r.GetMetadata()["decided_by"]; err == nil && (by == "failover" || by == "fallback") {
					p.ownerless.Store(time.Now().UnixNano())
				}
				if err == nil {
					l.mu.Lock()
					l.byKey[k].answered++
					if r.Status == pb.Status_UNDER_LIMIT {
						l.byKey[k].admitted++
						l.admissions[k] = append(l.admissions[k], admission{time.Now(), p.name, ts[i%len(ts)].name, r.GetMetadata()["decided_by"]})
					}
					l.mu.Unlock()
				}
			}
		})
	}
	t.Cleanup(l.stop)
	return l
}

func (l *chaosLoad) setTargets(ts []*chaosNode) { l.targets.Store(&ts) }

// next moves the load to its next phase.
func (l *chaosLoad) next() { l.phase.Add(1) }

// stop ends the load and waits for the checks in flight.
func (l *chaosLoad) stop() {
	l.stopped.Store(true)
	l.wg.Wait()
}

// admitted returns the checks admitted and the exact number a single
// perfect counter per key would have admitted for the same answered
// checks.
func (l *chaosLoad) admitted() (got, exact int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range l.byKey {
		got += k.admitted
		exact += min(k.answered, chaosLimit)
	}
	return got, exact
}

// answered returns phase p's answered share of the checks sent, in [0, 1].
func (p *chaosPhase) answered() (float64, int, int) {
	p.tally.mu.Lock()
	defer p.tally.mu.Unlock()
	ok := p.tally.admitted + p.tally.refused
	sent := ok + p.tally.errors
	if sent == 0 {
		return 1, 0, 0
	}
	return float64(ok) / float64(sent), sent, p.tally.errors
}

// table prints what the load saw, a row per phase, and the figures the
// scenario measured (e.g. time to converge).
func (l *chaosLoad) table(t *testing.T, title string, figures ...string) {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n| phase | checks sent | answered | errors | answered %% | admitted | mean check | slowest check | decided by |\n|---|---|---|---|---|---|---|---|---|\n", title)
	for _, p := range l.phases {
		share, sent, errs := p.answered()
		p.tally.mu.Lock()
		by, admitted := fmt.Sprint(p.tally.decidedBy), p.tally.admitted
		p.tally.mu.Unlock()
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %.3f | %d | %v | %v | %s |\n", p.name, sent, sent-errs, errs, 100*share, admitted,
			(time.Duration(p.total.Load()) / time.Duration(max(sent, 1))).Round(100*time.Microsecond),
			time.Duration(p.slowest.Load()).Round(time.Millisecond), by)
	}
	got, exact := l.admitted()
	fmt.Fprintf(&b, "\nadmitted %d, exact limit %d (%+.2f%%)\n", got, exact, 100*float64(got-exact)/float64(max(exact, 1)))
	for _, f := range figures {
		fmt.Fprintln(&b, f)
	}
	t.Log("\n" + b.String())
}

// minAnswered fails the test when phase i answered less than share of
// its checks.
func (l *chaosLoad) minAnswered(t *testing.T, i int, share float64) {
	t.Helper()
	p := l.phases[i]
	if got, sent, _ := p.answered(); got < share {
		errorf(t, "%s: answered %.3f%% of %d checks, want >= %.3f%%: %s", p.name, 100*got, sent, 100*share, p.tally.String())
	}
}

// perSide fails the test when a key admitted more than its limit once for
// each of sides: the bound in a partition, where each side decides a key
// on one counter (its owner's, or, on a side without the owner, that of
// the first member of the key's succession it reaches). It returns the
// most a key admitted.
func (l *chaosLoad) perSide(t *testing.T, sides int) int {
	t.Helper()
	if over := l.over(sides * chaosLimit); len(over) > 0 {
		errorf(t, "more than the limit %d once for each of %d sides:\n\t%s", chaosLimit, sides, strings.Join(over, "\n\t"))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	most := 0
	for _, n := range l.byKey {
		most = max(most, n.admitted)
	}
	return most
}

// ownerlessAfter returns how long after at the last check decided
// without its owner was answered in phases from on (0 if none was), and
// fails the test if any was in phase last.
func (l *chaosLoad) ownerlessAfter(t *testing.T, at time.Time, from, last int) time.Duration {
	t.Helper()
	var latest int64
	for _, p := range l.phases[from:] {
		latest = max(latest, p.ownerless.Load())
	}
	p := l.phases[last]
	p.tally.mu.Lock()
	n := p.tally.decidedBy["failover"] + p.tally.decidedBy["fallback"]
	p.tally.mu.Unlock()
	if n > 0 {
		errorf(t, "%s: %d checks decided without their owner, want 0", p.name, n)
	}
	if latest == 0 {
		return 0
	}
	return max(0, time.Unix(0, latest).Sub(at))
}

// within fails the test when the checks admitted differ from the exact
// limit by more than share of it.
func (l *chaosLoad) within(t *testing.T, share float64) {
	t.Helper()
	got, exact := l.admitted()
	if d := float64(got - exact); d > share*float64(exact) || -d > share*float64(exact) {
		errorf(t, "admitted %d, exact limit %d: off by more than %.1f%%", got, exact, 100*share)
	}
}

// cut disconnects n from the nodes' network: it keeps answering clients
// but reaches no other node, and no other node reaches it.
func (c *chaosCluster) cut(n *chaosNode) {
	c.t.Helper()
	if _, err := docker("network", "disconnect", c.network, n.container); err != nil {
		fatalf(c.t, "%v", err)
	}
}

// heal connects n back to the nodes' network with its address and names.
func (c *chaosCluster) heal(n *chaosNode) {
	c.t.Helper()
	if _, err := docker("network", "connect", "--ip", n.ip, "--alias", c.headless, "--alias", n.name, c.network, n.container); err != nil {
		fatalf(c.t, "%v", err)
	}
}

// stop stops n with SIGTERM, as the kubelet does, waiting longer than its
// shutdown timeout, and fails the test unless it exits 0. It returns how
// long the stop took.
func (c *chaosCluster) stop(n *chaosNode) time.Duration {
	c.t.Helper()
	start := time.Now()
	if _, err := docker("stop", "--time", fmt.Sprint(int(chaosGrace.Seconds())+15), n.container); err != nil {
		fatalf(c.t, "%v", err)
	}
	took := time.Since(start)
	if code, err := docker("inspect", "--format", "{{.State.ExitCode}}", n.container); err != nil || code != "0" {
		errorf(c.t, "%s: exit code %q (%v) after SIGTERM, want 0", n.name, code, err)
	}
	return took
}

// noLateKeys fails the test if a node of the cluster, formed and under
// load, has had a hand-off wait expire or a check wait for a late counter
// (ringlimit_handoff_waits_total): once it is ready, every previous
// owner's word that it is done has reached the members that wait for it,
// and no key's check waits for one. A word dropped, or refused by a
// member that had not admitted its sender yet, left the keys late: each
// one's first check waited --handoff-wait, and the client's batches with
// it (the load's first seconds answered a few dozen checks).
func (c *chaosCluster) noLateKeys() {
	t := c.t
	for _, n := range c.running() {
		for _, outcome := range []string{"expired", "still_late"} {
			v, err := metric(n.node, "ringlimit_handoff_waits_total", fmt.Sprintf("outcome=%q", outcome))
			switch {
			case err != nil:
				errorf(t, "%s: %v", n.name, err)
			case v != 0:
				errorf(t, "%s: %v checks' hand-off waits ended %s before the fault, want none once the cluster has formed", n.name, v, outcome)
			}
		}
	}
}

// fault runs a fault of length d under l, in l's phases: 3 s of load
// before, the fault from begin to end, and 5 s of load after the cluster
// has converged again (within 15 s of end); with a fourth phase, the third
// ends once the cluster has converged and the fourth is the 5 s after. It
// stops l and returns when end returned and how long the cluster took to
// converge after it.
func (c *chaosCluster) fault(l *chaosLoad, d time.Duration, begin, end func()) (time.Time, time.Duration) {
	c.t.Helper()
	time.Sleep(3 * time.Second) // load before the fault
	c.noLateKeys()
	l.next()
	begin()
	time.Sleep(d) // the fault itself
	end()
	ended := time.Now()
	l.next()
	converged := c.waitMembers(15 * time.Second)
	if len(l.phases) > 3 {
		l.next()
	}
	time.Sleep(5 * time.Second) // load after the fault
	l.stop()
	return ended, converged
}
