//go:build scale

// The scale test runs only with -tags scale (`make scale`): 33 rlnode
// processes and a million counters take minutes, too slow for `make test`.
// It measures; the figures it prints are docs/scale.md's table. It asserts
// only what must hold at any speed: convergence, hand-offs that complete,
// and checks that admit exactly their limit through a join and a leave.

package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/ring"
)

// The scale test's sizes.
const (
	scaleNodes    = 32
	scaleCounters = 1_000_000 // distinct keys written before the join and the leave
	scaleBatch    = 1000      // items a request when writing them (checks.MaxItems)
	scaleWriters  = 4         // concurrent writers: the load, on two cores
	shareSample   = 100_000   // keys placed on the ring to find the busiest node
	idleSettle    = 10 * time.Second
	idleWindow    = 30 * time.Second // memberlist's push/pull interval up to 32 nodes
	handoffWait   = 2 * time.Minute  // bound on one hand-off of ~1/32 of the counters
	exactLimit    = 300              // limit of each key checked through a join or leave
	exactKeys     = 4
	exactWorkers  = 4
	exactPace     = 10 * time.Millisecond // between one worker's checks
)

// figures is the table the test prints, in order, and what failed.
type figures struct {
	rows   [][2]string
	failed []string
}

// errorf fails t, as t.Errorf does, and keeps the message for the end of
// the output (see TestScale's first Cleanup).
func (f *figures) errorf(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	f.failed = append(f.failed, msg)
	t.Error(msg)
}

func (f *figures) add(what, format string, args ...any) {
	f.rows = append(f.rows, [2]string{what, fmt.Sprintf(format, args...)})
}

func (f *figures) String() string {
	var b strings.Builder
	b.WriteString("| Figure (32 rlnode processes on loopback) | Measured |\n|---|---|\n")
	for _, r := range f.rows {
		fmt.Fprintf(&b, "| %s | %s |\n", r[0], r[1])
	}
	return b.String()
}

// TestScale starts 32 nodes, writes a million counters, has a 33rd node
// join and one node leave, and kills another, measuring each step. The
// table goes to the test log and, if RINGLIMIT_SCALE_OUT names a file, to
// that file.
func TestScale(t *testing.T) {
	if rlnodeBin == "" {
		t.Skip("the scale test needs the rlnode binary; skipped in -short mode")
	}
	testStart := time.Now()
	f := &figures{}
	// Last of all, below every node's output, which may be long: on a
	// failure, the figures measured so far and what failed, so that an
	// output's tail says what happened.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("scale figures so far:\n%s\nfailed:\n%s", f, strings.Join(f.failed, "\n"))
		}
	})
	c := &testCluster{t: t}
	t.Cleanup(c.stopAll)
	// Killed rather than stopped one by one: 32 orderly shutdowns, each
	// handing its counters to the others, would take minutes and measure
	// nothing. stopAll then finds them exited (Cleanup runs last first).
	t.Cleanup(func() {
		for _, n := range c.running() {
			n.signal(t, syscall.SIGKILL)
			<-n.done
		}
	})

	// 1. Start and converge.
	start := time.Now()
	for range scaleNodes {
		c.add()
	}
	started := time.Since(start)
	settle := c.waitConverged(scaleNodes)
	f.add("Time from the first start to a converged ring (every node lists the same 32 alive)",
		"%v (the last node started at %v; converged %v after)", round(time.Since(start)), round(started), round(settle))

	// 2. The busiest node's share of keys, on the ring the nodes built.
	r := ringSeen(t, c.nodes[0])
	owned := map[string]int{}
	for i := range shareSample {
		m, _ := r.Owner("share:" + strconv.Itoa(i))
		owned[m.Name]++
	}
	busiest, least := 0, shareSample
	for _, k := range owned {
		busiest, least = max(busiest, k), min(least, k)
	}
	f.add(fmt.Sprintf("Busiest node's share of %d keys (fair share 1/32 = 3.13%%)", shareSample),
		"%.2f%% (%.2fx fair; least loaded %.2f%%)", pct(busiest, shareSample),
		float64(busiest)*scaleNodes/shareSample, pct(least, shareSample))

	// 3. Idle: gossip bytes a second, goroutines, streams, RSS, once the
	// gossip of the joins has died down, over a whole push/pull interval.
	time.Sleep(idleSettle) // letting the joins' gossip end, not waiting for an effect
	g0 := gossipBytes(t, c.nodes)
	time.Sleep(idleWindow) // the measurement window, not waiting for an effect
	g1 := gossipBytes(t, c.nodes)
	f.add("Gossip bytes/s per node, idle (mean / max)", "%s", rate(g0, g1, idleWindow))
	f.add("Per node, idle (mean / max)", "%s", sampleAll(t, c.nodes))

	// 4. Under load: the million counters written in batches of 1,000 by
	// four callers spread over the nodes; measured between 20% and 80%.
	var written atomic.Int64
	load := writeCounters(t, c.nodes, &written)
	waitWritten(t, &written, scaleCounters/5)
	g0, t0 := gossipBytes(t, c.nodes), time.Now()
	waitWritten(t, &written, scaleCounters*4/5)
	g1, window := gossipBytes(t, c.nodes), time.Since(t0)
	loaded := sampleAll(t, c.nodes)
	took := load()
	f.add("Gossip bytes/s per node, under load (mean / max)", "%s", rate(g0, g1, window))
	f.add("Per node, under load (mean / max)", "%s", loaded)
	f.add("The load: 1,000,000 new keys in 1,000 requests of 1,000 items, 4 callers",
		"%v, %.0f checks/s", round(took), float64(scaleCounters)/took.Seconds())
	held := sumMetric(t, c.nodes, "ringlimit_counters")
	if held < scaleCounters {
		t.Fatalf("the nodes hold %v counters after %d keys were written, want at least that (evicted %v, dropped back to full %v)", held, scaleCounters,
			sumMetric(t, c.nodes, "ringlimit_counters_evicted_total"), sumMetric(t, c.nodes, "ringlimit_counters_idle_dropped_total"))
	}

	// 5. A 33rd node joins: the keys it comes to own are handed to it,
	// while checks on keys moving to it stay exact.
	joiner := fmt.Sprintf("e2e-%d", scaleNodes)
	before := ringSeen(t, c.nodes[0])
	after := ring.New(append(before.Members(), ring.Member{Name: joiner})...)
	moved, toJoiner := movedKeys(before, after, joiner)
	exact := startExact(t, "join", c.running(), keysOwnedBy(after, joiner, "exact-join:"))
	recv0 := sumMetric(t, c.nodes, "ringlimit_handoff_counters_total", `direction="received"`)
	w0 := waits(t, c.nodes)
	start = time.Now()
	newNode := c.add()
	io0 := procIO(t, newNode)
	c.waitConverged(scaleNodes + 1)
	converged := time.Since(start)
	poll(t, handoffWait, "the join's hand-off", func() (bool, string) {
		got := sumMetric(t, c.running(), "ringlimit_handoff_counters_total", `direction="received"`) - recv0
		return got >= float64(moved), fmt.Sprintf("%v of %d counters received", got, moved)
	})
	handedOff := time.Since(start)
	joinerGot := metricOf(t, newNode, "ringlimit_handoff_counters_total", `direction="received"`)
	joinerRecords := metricOf(t, newNode, "ringlimit_handoff_bytes_total", `direction="received"`)
	readBytes := procIO(t, newNode).read - io0.read
	f.add("Join: checks through it on 4 keys moving to the new node, limit 300 each: admitted",
		"%s", exact.finish(t, f, 0))
	f.add("Join: checks that waited for a moved counter, by how the wait ended", "%s", waitsSince(t, c.nodes, w0))
	f.add("Join of a 33rd node: counters that change owner (to the new node)",
		"%d (%d; %.0f expected at 1/33)", moved, toJoiner, float64(scaleCounters)/33)
	f.add("Join: time from its start to converged / to every moved counter handed off",
		"%v / %v", round(converged), round(handedOff))
	f.add("Join: bytes the new node read from its start until then (all its traffic)",
		"%s (%.0f B per counter it received)", mib(readBytes), float64(readBytes)/joinerGot)
	f.add("Join: bytes of the counter records it received (ringlimit_handoff_bytes_total)",
		"%s (%.0f B per counter)", mib(joinerRecords), joinerRecords/joinerGot)

	// 6. One node leaves (SIGTERM): it hands its counters to their new
	// owners before it exits, while checks on its keys stay exact.
	leaver := c.nodes[scaleNodes/2]
	before = ringSeen(t, c.nodes[0])
	leaving := 0
	for i := range scaleCounters {
		if m, _ := before.Owner(scaleKey(i)); m.Name == leaver.name {
			leaving++
		}
	}
	others := slices.DeleteFunc(c.running(), func(n *node) bool { return n == leaver })
	exact = startExact(t, "leave", others, keysOwnedBy(before, leaver.name, "exact-leave:"))
	recv0 = sumMetric(t, others, "ringlimit_handoff_counters_total", `direction="received"`)
	records0 := sumMetric(t, others, "ringlimit_handoff_bytes_total", `direction="received"`)
	w0 = waits(t, others)
	io0 = procIO(t, leaver)
	last := io0
	start = time.Now()
	leaver.signal(t, syscall.SIGTERM)
	poll(t, handoffWait, "the leave's hand-off", func() (bool, string) {
		if !leaver.exited() {
			if s, ok := tryProcIO(leaver); ok {
				last = s
			}
		}
		got := sumMetric(t, others, "ringlimit_handoff_counters_total", `direction="received"`) - recv0
		return got >= float64(leaving), fmt.Sprintf("%v of %d counters received", got, leaving)
	})
	handedOff = time.Since(start)
	if !leaver.wait(shutdownTimeout + 5*time.Second) {
		t.Fatalf("%s did not exit after SIGTERM", leaver.name)
	}
	exited := leaver.exitedAt.Sub(start)
	c.waitConverged(scaleNodes)
	// A check whose answer is lost as the leaving node's connections
	// close is charged twice (docs/cluster.md, the residuals): at most the
	// checks in flight then, one per worker.
	f.add("Leave: checks through it on 4 keys of the leaving node, limit 300 each: admitted",
		"%s", exact.finish(t, f, exactWorkers))
	f.add("Leave: checks that waited for a moved counter, by how the wait ended", "%s", waitsSince(t, others, w0))
	f.add("Leave (SIGTERM) of one node: counters it owned", "%d", leaving)
	f.add("Leave: time from SIGTERM to every counter received / to its exit",
		"%v / %v", round(handedOff), round(exited))
	f.add("Leave: bytes the leaving node wrote from SIGTERM (all its traffic, last read before exit)",
		"%s (%.0f B per counter)", mib(last.written-io0.written), float64(last.written-io0.written)/float64(leaving))
	records := sumMetric(t, others, "ringlimit_handoff_bytes_total", `direction="received"`) - records0
	f.add("Leave: bytes of the counter records the others received (ringlimit_handoff_bytes_total)",
		"%s (%.0f B per counter)", mib(records), records/float64(leaving))

	// 7. kill -9 of one node: how long until every other node drops it.
	victim := c.nodes[scaleNodes/4]
	survivors := slices.DeleteFunc(c.running(), func(n *node) bool { return n == victim })
	start = time.Now()
	victim.signal(t, syscall.SIGKILL)
	firstDrop := time.Duration(0)
	poll(t, time.Minute, "every node drops the killed node", func() (bool, string) {
		seen := 0
		for _, n := range survivors {
			ms, err := members(n)
			if err == nil && !slices.Contains(aliveNames(ms), victim.name) {
				continue
			}
			seen++
		}
		if seen < len(survivors) && firstDrop == 0 {
			firstDrop = time.Since(start)
		}
		return seen == 0, fmt.Sprintf("%d of %d nodes still list %s alive", seen, len(survivors), victim.name)
	})
	f.add("kill -9 of one node: time until the first / every other node drops it",
		"%v / %v", round(firstDrop), round(time.Since(start)))
	f.add("Whole test (start to last figure)", "%v", round(time.Since(testStart)))

	t.Logf("scale figures:\n%s", f)
	if out := os.Getenv("RINGLIMIT_SCALE_OUT"); out != "" {
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(out, []byte(f.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func scaleKey(i int) string { return "scale:" + strconv.Itoa(i) }

// scaleItem is one hit on key i, in a fixed window of a year: a counter
// that stays until the window ends (a token bucket back to full would be
// dropped, carrying nothing, long before the hand-offs).
func scaleItem(i int) *pb.CheckItem {
	return &pb.CheckItem{Name: "scale", Key: scaleKey(i), Limit: 1000, DurationMs: year, Algorithm: pb.Algorithm_FIXED_WINDOW}
}

// ringSeen builds the ring n's alive members make, as every node does:
// the ring hashes names only.
func ringSeen(t *testing.T, n *node) *ring.Ring {
	t.Helper()
	ms, err := members(n)
	if err != nil {
		t.Fatal(err)
	}
	return ringOf(aliveNames(ms)...)
}

// movedKeys counts the written keys whose owner differs between before and
// after, and of them those that after gives to name.
func movedKeys(before, after *ring.Ring, name string) (moved, toName int) {
	for i := range scaleCounters {
		b, _ := before.Owner(scaleKey(i))
		a, _ := after.Owner(scaleKey(i))
		if a.Name != b.Name {
			moved++
			if a.Name == name {
				toName++
			}
		}
	}
	return moved, toName
}

// keysOwnedBy returns exactKeys keys with prefix that r gives to name.
func keysOwnedBy(r *ring.Ring, name, prefix string) []string {
	var keys []string
	for i := 0; len(keys) < exactKeys; i++ {
		k := prefix + strconv.Itoa(i)
		if m, _ := r.Owner(k); m.Name == name {
			keys = append(keys, k)
		}
	}
	return keys
}

// writeCounters starts scaleWriters callers that write scaleCounters keys
// in batches, each batch to the next node in turn, counting the keys
// written in written. The function it returns waits for them and returns
// how long they took; any error fails the test.
func writeCounters(t *testing.T, nodes []*node, written *atomic.Int64) func() time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	errs := make(chan error, scaleWriters)
	for range scaleWriters {
		wg.Go(func() {
			for {
				b := int(next.Add(1) - 1)
				if b*scaleBatch >= scaleCounters {
					return
				}
				items := make([]*pb.CheckItem, 0, scaleBatch)
				for i := b * scaleBatch; i < min((b+1)*scaleBatch, scaleCounters); i++ {
					items = append(items, scaleItem(i))
				}
				rs, err := checkMany(nodes[b%len(nodes)], items)
				if err == nil {
					for j, r := range rs {
						if r.Error != "" || r.Status != pb.Status_UNDER_LIMIT {
							err = fmt.Errorf("write %s: %v", items[j].Key, r)
							break
						}
					}
				}
				if err != nil {
					errs <- err
					return
				}
				written.Add(int64(len(items)))
			}
		})
	}
	return func() time.Duration {
		wg.Wait()
		took := time.Since(start)
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		return took
	}
}

func waitWritten(t *testing.T, written *atomic.Int64, n int) {
	t.Helper()
	poll(t, 10*time.Minute, fmt.Sprintf("%d keys written", n), func() (bool, string) {
		got := written.Load()
		return got >= int64(n), fmt.Sprint(got, " written")
	})
}

// exactLoad is checks of one hit on a few keys, from a few workers over
// nodes, through a join or a leave.
type exactLoad struct {
	phase string
	nodes []*node
	keys  []string
	tl    []*tally // per key
	stop  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	// remaining holds, per key, the admissions by the remaining hits
	// their answers reported: in an exact count each value is answered
	// once, so a value answered twice marks two checks decided on the
	// same state, and names the nodes asked (see over).
	remaining []map[int64][]string
	// slow lists the checks answered after slowCheck, or not at all: a
	// forward that runs out its deadline fails over, and may be charged
	// twice or decided on a heir's replica.
	slow []string
}

// slowCheck is the time past which an exact check is listed as slow: half
// the forward deadline.
const slowCheck = time.Second

// startExact starts the checks; finish stops them.
func startExact(t *testing.T, phase string, nodes []*node, keys []string) *exactLoad {
	l := &exactLoad{phase: phase, nodes: nodes, keys: keys, stop: make(chan struct{})}
	for range keys {
		l.tl = append(l.tl, &tally{})
		l.remaining = append(l.remaining, map[int64][]string{})
	}
	for w := range exactWorkers {
		l.wg.Go(func() {
			// Bounded by count as well as by stop: 20 minutes' worth.
			for i := range 120_000 {
				select {
				case <-l.stop:
					return
				default:
				}
				k := (w + i) % len(keys)
				n := nodes[rand.IntN(len(nodes))]
				l.add(k, n, time.Now())
				time.Sleep(exactPace) // pacing the load, not waiting for an effect
			}
		})
	}
	return l
}

// add checks key k at n, sent at sent, and tallies the answer.
func (l *exactLoad) add(k int, n *node, sent time.Time) (*pb.CheckResult, error) {
	r, err := check(n, l.item(k))
	l.tl[k].add(r, err)
	took := time.Since(sent)
	l.mu.Lock()
	defer l.mu.Unlock()
	what := fmt.Sprintf("%s at %s, %v", n.name, sent.Format("15:04:05.000"), took.Round(time.Millisecond))
	if err != nil {
		l.slow = append(l.slow, fmt.Sprintf("key %s: %s: %v", l.keys[k], what, err))
		return r, err
	}
	what += fmt.Sprintf(", decided_by %q", r.Metadata["decided_by"])
	if took > slowCheck {
		l.slow = append(l.slow, fmt.Sprintf("key %s: %s, %v, remaining %d", l.keys[k], what, r.Status, r.Remaining))
	}
	if r.Status == pb.Status_UNDER_LIMIT {
		l.remaining[k][r.Remaining] = append(l.remaining[k][r.Remaining], what)
	}
	return r, err
}

// over describes key k's admissions that answered the same remaining
// hits as another: the checks decided on a counter without hits admitted
// elsewhere.
func (l *exactLoad) over(k int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for rem, checks := range l.remaining[k] {
		if len(checks) > 1 {
			out = append(out, fmt.Sprintf("remaining %d: %s", rem, strings.Join(checks, "; ")))
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// gaps describes key k's remaining hits that no admission answered, with
// the admissions that answered the values either side: where a check was
// charged without its admission reaching the test (charged twice, or its
// answer lost).
func (l *exactLoad) gaps(k int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for rem := range int64(exactLimit) {
		if _, ok := l.remaining[k][rem]; ok {
			continue
		}
		out = append(out, fmt.Sprintf("remaining %d: none; %d: %s; %d: %s", rem,
			rem+1, strings.Join(l.remaining[k][rem+1], "; "), rem-1, strings.Join(l.remaining[k][rem-1], "; ")))
	}
	return strings.Join(out, "\n")
}

func (l *exactLoad) item(k int) *pb.CheckItem {
	// A token bucket that refills its limit in a year, a hit in 29 hours:
	// nothing refills during the test, so exactly the limit is admitted in
	// all, and no window rolls over, as a clock hour's fixed window would.
	return &pb.CheckItem{Name: "exact", Key: l.keys[k], Limit: exactLimit, DurationMs: year, Algorithm: pb.Algorithm_TOKEN_BUCKET}
}

// finish stops the workers, then spends what is left of each key until the
// first refusal, and fails the test unless each key admitted exactly its
// limit with no errors, but for short checks in all that may have been
// charged twice (admitted less, never more). It returns what each key
// admitted.
func (l *exactLoad) finish(t *testing.T, f *figures, short int) string {
	t.Helper()
	var admitted []string
	missing := 0
	close(l.stop)
	l.wg.Wait()
	for k, key := range l.keys {
		during := l.tl[k].String()
		for i := 0; i <= exactLimit; i++ {
			r, err := l.add(k, l.nodes[i%len(l.nodes)], time.Now())
			if err != nil || r.Status != pb.Status_UNDER_LIMIT {
				break
			}
		}
		t.Logf("%s: key %s: during the %s %s; with the rest spent %v", l.phase, key, l.phase, during, l.tl[k])
		admitted = append(admitted, strconv.Itoa(l.tl[k].admitted))
		tl := l.tl[k]
		if tl.admitted > exactLimit || tl.errors != 0 {
			f.errorf(t, "%s: key %s admitted %d on a limit of %d, %d errors (%v); want at most the limit, no errors; admissions that answered the same remaining hits (node asked, sent at, took):\n%s",
				l.phase, key, tl.admitted, exactLimit, tl.errors, tl, l.over(k))
		}
		if tl.admitted < exactLimit {
			t.Logf("%s: key %s: hits charged without an admission answered:\n%s", l.phase, key, l.gaps(k))
		}
		missing += max(exactLimit-tl.admitted, 0)
	}
	if missing > short {
		f.errorf(t, "%s: the keys admitted %d fewer than their limits in all, want at most %d (exactly the limits but for checks charged twice)",
			l.phase, missing, short)
	}
	if len(l.slow) != 0 {
		l.mu.Lock()
		t.Logf("%s: checks answered after %v, or not at all:\n%s", l.phase, slowCheck, strings.Join(l.slow, "\n"))
		l.mu.Unlock()
	}
	return strings.Join(admitted, ", ")
}

var waitOutcomes = [...]string{"done", "expired", "canceled", "arrived_late", "still_late"}

// waits sums over nodes the checks that have waited for a counter being
// handed over, by outcome (waitOutcomes).
func waits(t *testing.T, nodes []*node) [len(waitOutcomes)]float64 {
	t.Helper()
	var out [len(waitOutcomes)]float64
	for i, outcome := range waitOutcomes {
		out[i] = sumMetric(t, nodes, "ringlimit_handoff_waits_total", fmt.Sprintf("outcome=%q", outcome))
	}
	return out
}

// waitsSince describes the waits since w0.
func waitsSince(t *testing.T, nodes []*node, w0 [len(waitOutcomes)]float64) string {
	t.Helper()
	var parts []string
	for i, v := range waits(t, nodes) {
		parts = append(parts, fmt.Sprintf("%s %.0f", waitOutcomes[i], v-w0[i]))
	}
	return strings.Join(parts, ", ")
}

// gossipBytes returns the gossip bytes each node has caused so far.
func gossipBytes(t *testing.T, nodes []*node) []float64 {
	t.Helper()
	var out []float64
	for _, n := range nodes {
		out = append(out, metricOf(t, n, "ringlimit_gossip_bytes_total"))
	}
	return out
}

// rate summarises the gossip bytes a second each node caused between two
// readings d apart.
func rate(b0, b1 []float64, d time.Duration) string {
	var sum, top float64
	for i := range b0 {
		r := (b1[i] - b0[i]) / d.Seconds()
		sum += r
		top = max(top, r)
	}
	return fmt.Sprintf("%.0f / %.0f B/s", sum/float64(len(b0)), top)
}

func metricOf(t *testing.T, n *node, name string, labels ...string) float64 {
	t.Helper()
	v, err := metric(n, name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func sumMetric(t *testing.T, nodes []*node, name string, labels ...string) float64 {
	t.Helper()
	var sum float64
	for _, n := range nodes {
		sum += metricOf(t, n, name, labels...)
	}
	return sum
}

// sampleAll reads each node's goroutines, open peer connections, sockets
// and RSS, and summarises them as mean / max.
func sampleAll(t *testing.T, nodes []*node) string {
	t.Helper()
	const k = 4
	names := [k]string{"goroutines", "peer connections accepted", "sockets", "RSS MiB"}
	var sum, top [k]float64
	for _, n := range nodes {
		rss, sockets := procStatus(t, n)
		v := [k]float64{
			metricOf(t, n, "go_goroutines"),
			metricOf(t, n, "ringlimit_connections_open", `listener="peer"`),
			sockets,
			rss / 1024,
		}
		for i := range k {
			sum[i] += v[i]
			top[i] = max(top[i], v[i])
		}
	}
	var parts []string
	for i := range k {
		parts = append(parts, fmt.Sprintf("%s %.0f / %.0f", names[i], sum[i]/float64(len(nodes)), top[i]))
	}
	return strings.Join(parts, "; ")
}

// procStatus returns n's resident set in KiB (VmRSS of /proc/PID/status)
// and how many sockets it has open (its file descriptors that are ones).
func procStatus(t *testing.T, n *node) (rssKiB, sockets float64) {
	t.Helper()
	pid := n.cmd.Process.Pid
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			rssKiB, err = strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatalf("/proc/%d/status: %q: %v", pid, line, err)
			}
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			sockets++
		}
	}
	return rssKiB, sockets
}

// ioCounts are a process's bytes read and written by system calls (rchar
// and wchar of /proc/PID/io): its TCP traffic, its log and little else.
type ioCounts struct{ read, written float64 }

func procIO(t *testing.T, n *node) ioCounts {
	t.Helper()
	s, ok := tryProcIO(n)
	if !ok {
		t.Fatalf("%s: cannot read /proc/%d/io", n.name, n.cmd.Process.Pid)
	}
	return s
}

// tryProcIO reads n's /proc/PID/io; it reports false once n has exited.
func tryProcIO(n *node) (ioCounts, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", n.cmd.Process.Pid))
	if err != nil {
		return ioCounts{}, false
	}
	var s ioCounts
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return ioCounts{}, false
		}
		switch f[0] {
		case "rchar:":
			s.read = v
		case "wchar:":
			s.written = v
		}
	}
	return s, true
}

func round(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }

func pct(a, b int) float64 { return 100 * float64(a) / float64(b) }

func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }
