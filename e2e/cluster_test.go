package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// TestConverge starts three processes and checks each one's view of the
// cluster, then that they share one counter through the HTTP API.
func TestConverge(t *testing.T) {
	c := startCluster(t, 3)
	for _, n := range c.nodes {
		ms, err := members(n)
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) != 3 {
			t.Errorf("%s lists %d members, want 3: %+v", n.name, len(ms), ms)
		}
		var share float64
		for _, m := range ms {
			want := c.byName(m.Name)
			switch {
			case want == nil:
				t.Errorf("%s lists unknown member %+v", n.name, m)
				continue
			case m.State != "alive":
				t.Errorf("%s sees %s as %q, want alive", n.name, m.Name, m.State)
			case m.Self != (m.Name == n.name):
				t.Errorf("%s lists %s with self=%v", n.name, m.Name, m.Self)
			case m.GRPCAddr != want.grpc || m.PeerAddr != want.peer || m.GossipAddr != want.gossip:
				t.Errorf("%s lists %s at grpc %s peer %s gossip %s, want %s %s %s",
					n.name, m.Name, m.GRPCAddr, m.PeerAddr, m.GossipAddr, want.grpc, want.peer, want.gossip)
			case m.Share <= 0:
				t.Errorf("%s gives %s a share of %v, want > 0", n.name, m.Name, m.Share)
			}
			share += m.Share
		}
		if math.Abs(share-1) > 0.01 {
			t.Errorf("%s: shares add up to %v, want 1", n.name, share)
		}
		if code, body, err := httpGet(n.http + "/metrics"); err != nil || code != http.StatusOK {
			t.Errorf("%s: GET /metrics: %d %v %.200s", n.name, code, err, body)
		}
	}

	// One counter of limit 3, spent through each node in turn over HTTP:
	// the fourth check is refused whichever node receives it.
	for i, want := range []string{"UNDER_LIMIT", "UNDER_LIMIT", "UNDER_LIMIT", "OVER_LIMIT"} {
		n := c.nodes[i%len(c.nodes)]
		code, body, err := httpPost(n.http+"/v1/check", map[string]any{
			"requests": []map[string]any{{"name": "converge", "key": "shared", "limit": 3, "duration_ms": hour}},
		})
		if err != nil || code != http.StatusOK {
			t.Fatalf("%s: POST /v1/check: %d %v %s", n.name, code, err, body)
		}
		var resp struct {
			Responses []struct {
				Status    string `json:"status"`
				Remaining int64  `json:"remaining"`
				Error     string `json:"error"`
			} `json:"responses"`
		}
		if err := json.Unmarshal(body, &resp); err != nil || len(resp.Responses) != 1 {
			t.Fatalf("%s: POST /v1/check: %v %s", n.name, err, body)
		}
		if r := resp.Responses[0]; r.Status != want || r.Error != "" {
			t.Errorf("check %d via %s: %s remaining %d error %q, want %s", i+1, n.name, r.Status, r.Remaining, r.Error, want)
		}
	}
}

func (c *testCluster) byName(name string) *node {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// TestExactBurst: 1,500 concurrent checks on one key with limit 100, from
// 150 goroutines spread over three processes, admit exactly 100 when the
// owner decides every check.
func TestExactBurst(t *testing.T) {
	c := startCluster(t, 3)
	for _, behavior := range []pb.Behavior{pb.Behavior_BATCHED, pb.Behavior_UNBATCHED} {
		t.Run(behavior.String(), func(t *testing.T) {
			item := &pb.CheckItem{Name: "burst", Key: "hot:" + behavior.String(), Limit: 100, DurationMs: hour, Behavior: behavior}
			start := time.Now()
			tl := burst(c.nodes, item, 1500, 150)
			t.Logf("%v: %v in %v", behavior, tl, time.Since(start).Round(time.Millisecond))
			if tl.errors != 0 || tl.admitted != 100 || tl.refused != 1400 {
				t.Errorf("%v: 1500 checks over 3 nodes: %v; want exactly 100 admitted, 1400 refused, no errors", behavior, tl)
			}
		})
	}
}

// TestGlobalBurst: with GLOBAL, nodes answer from grants the owner lent
// them, and the cluster never admits more than the limit. Hits lent to a
// node and not used by the end of the burst are used by later checks or
// given back, so checks that go on get exactly the rest of the limit.
// Afterwards the owner knows every hit and broadcasts it to every node.
func TestGlobalBurst(t *testing.T) {
	c := startCluster(t, 3)
	item := &pb.CheckItem{Name: "burst", Key: "hot:global", Limit: 100, DurationMs: hour, Behavior: pb.Behavior_GLOBAL}
	start := time.Now()
	tl := burst(c.nodes, item, 1500, 150)
	t.Logf("GLOBAL: %v in %v", tl, time.Since(start).Round(time.Millisecond))
	if tl.errors != 0 || tl.admitted > 100 {
		t.Fatalf("GLOBAL: 1500 checks over 3 nodes: %v; want at most 100 admitted, no errors", tl)
	}
	admitted := tl.admitted
	poll(t, 10*time.Second, "the rest of the limit admitted after the burst, and no more", func() (bool, string) {
		for _, n := range c.nodes {
			if r, err := check(n, item); err == nil && r.Status == pb.Status_UNDER_LIMIT {
				admitted++
			}
		}
		if admitted > 100 {
			t.Fatalf("GLOBAL admitted %d on a limit of 100", admitted)
		}
		return admitted == 100, fmt.Sprint("admitted ", admitted)
	})
	for _, n := range c.nodes {
		if r, err := check(n, item); err != nil || r.Status != pb.Status_OVER_LIMIT {
			t.Errorf("%s: check after the whole limit was admitted: %v %v, want refused", n.name, r, err)
		}
	}

	// A peek routed to the owner (BATCHED), and a GLOBAL peek answered
	// from each node's copy, all eventually report nothing remaining.
	took := poll(t, 10*time.Second, "counter spent everywhere after the GLOBAL burst", func() (bool, string) {
		var status []string
		ok := true
		for _, n := range c.nodes {
			for _, b := range []pb.Behavior{pb.Behavior_BATCHED, pb.Behavior_GLOBAL} {
				peek := &pb.CheckItem{Name: item.Name, Key: item.Key, Limit: item.Limit, DurationMs: item.DurationMs, Behavior: b, Hits: ptr(int64(0))}
				r, err := check(n, peek)
				if err != nil {
					ok = false
					status = append(status, err.Error())
					continue
				}
				if r.Remaining != 0 {
					ok = false
				}
				status = append(status, fmt.Sprintf("%s %v peek: remaining %d", n.name, b, r.Remaining))
			}
		}
		return ok, fmt.Sprint(status)
	})
	t.Logf("every node reported 0 remaining %v after the burst", took.Round(time.Millisecond))
}

// TestKillNine kills one of three nodes with SIGKILL: the other two must
// notice within 10 s, answer every check meanwhile and afterwards, and
// never return an error (a check decided by fallback is an answer).
func TestKillNine(t *testing.T) {
	c := startCluster(t, 3)
	victim, survivors := c.nodes[2], c.nodes[:2]

	// Warm the survivors' connections to the victim, so that checks after
	// the kill meet a dead peer rather than a first dial.
	for i := range 30 {
		if _, err := check(survivors[i%2], &pb.CheckItem{Name: "warm", Key: fmt.Sprint("warm:", i), Limit: 10, DurationMs: hour}); err != nil {
			t.Fatalf("before the kill: %v", err)
		}
	}

	victim.signal(t, syscall.SIGKILL)

	// Until the survivors notice, keep checking through them: each check
	// must still be answered. The loop is bounded by count and deadline.
	noticed := make(chan struct{})
	stopLoad := sync.OnceFunc(func() { close(noticed) })
	during := &tally{}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopLoad() // if the poll below fails
	for w, n := range survivors {
		wg.Go(func() {
			for i := range 2000 {
				select {
				case <-noticed:
					return
				default:
				}
				item := &pb.CheckItem{Name: "during", Key: fmt.Sprintf("during:%d:%d", w, i%50), Limit: 1000, DurationMs: hour}
				during.add(check(n, item))
				time.Sleep(5 * time.Millisecond) // pacing the load, not waiting for an effect
			}
		})
	}

	took := poll(t, 15*time.Second, "survivors notice the killed node", func() (bool, string) {
		var status []string
		ok := true
		for _, n := range survivors {
			ms, err := members(n)
			if err != nil {
				ok = false
				status = append(status, fmt.Sprintf("%s: %v", n.name, err))
				continue
			}
			alive := aliveNames(ms)
			for _, name := range alive {
				if name == victim.name {
					ok = false
				}
			}
			status = append(status, fmt.Sprintf("%s sees alive %v", n.name, alive))
		}
		return ok, fmt.Sprint(status)
	})
	stopLoad()
	wg.Wait()
	t.Logf("survivors noticed the SIGKILL after %v; checks meanwhile: %v", took.Round(time.Millisecond), during)
	if took >= 10*time.Second {
		t.Errorf("survivors noticed the SIGKILL after %v, want < 10s", took)
	}
	if during.errors != 0 {
		t.Errorf("checks between the SIGKILL and its detection: %v; want no errors", during)
	}
	if fb := during.decidedBy["fallback"]; fb > 0 {
		// Each fallback answer is counted by the node that gave it.
		total := 0.0
		for _, n := range survivors {
			v, err := metric(n, "ringlimit_forward_fallbacks_total")
			if err != nil {
				t.Fatal(err)
			}
			total += v
		}
		t.Logf("ringlimit_forward_fallbacks_total on the survivors: %v (answers marked fallback: %d)", total, fb)
		if total <= 0 {
			t.Errorf("%d answers said decided_by=fallback, but ringlimit_forward_fallbacks_total is %v", fb, total)
		}
	}
	if !victim.wait(5 * time.Second) {
		t.Errorf("%s still running after SIGKILL", victim.name)
	}

	// Now 300 checks on various keys, some of which the dead node owned.
	after := &tally{}
	for w := range 30 {
		n := survivors[w%2]
		wg.Go(func() {
			for i := range 10 {
				item := &pb.CheckItem{Name: "after", Key: fmt.Sprintf("after:%d", w*10+i), Limit: 10, DurationMs: hour}
				after.add(check(n, item))
			}
		})
	}
	wg.Wait()
	t.Logf("300 checks after detection: %v", after)
	if after.errors != 0 || after.admitted != 300 {
		t.Errorf("300 checks after detection: %v; want 300 admitted, no errors", after)
	}
}

// Half-spent counters used by the hand-off tests.
const (
	counters      = 600
	counterLimit  = 10
	counterSpent  = 5
	keepTimeout   = 15 * time.Second
	checkItemsMax = 200 // items per request when spending or peeking
)

func counterItem(i int, hits int64) *pb.CheckItem {
	return &pb.CheckItem{Name: "handoff", Key: fmt.Sprint("user:", i), Limit: counterLimit, DurationMs: hour, Hits: ptr(hits)}
}

// spend charges counterSpent of each counter through n.
func spend(t *testing.T, n *node) {
	t.Helper()
	for lo := 0; lo < counters; lo += checkItemsMax {
		var items []*pb.CheckItem
		for i := lo; i < min(lo+checkItemsMax, counters); i++ {
			items = append(items, counterItem(i, counterSpent))
		}
		rs, err := checkMany(n, items)
		if err != nil {
			t.Fatalf("spend: %v", err)
		}
		for j, r := range rs {
			if r.Error != "" || r.Status != pb.Status_UNDER_LIMIT || r.Remaining != counterLimit-counterSpent {
				t.Fatalf("spend %s via %s: %v", items[j].Key, n.name, r)
			}
		}
	}
}

// kept peeks at every counter through n and returns how many still have
// exactly counterLimit-counterSpent remaining, and a summary.
func kept(n *node) (int, string) { return keptAt(n, counterLimit-counterSpent) }

// keptAt peeks at every counter through n and returns how many have
// exactly want remaining, and a summary.
func keptAt(n *node, want int64) (int, string) {
	k := 0
	remaining := map[int64]int{}
	errs := 0
	for lo := 0; lo < counters; lo += checkItemsMax {
		var items []*pb.CheckItem
		for i := lo; i < min(lo+checkItemsMax, counters); i++ {
			items = append(items, counterItem(i, 0))
		}
		rs, err := checkMany(n, items)
		if err != nil {
			return 0, err.Error()
		}
		for _, r := range rs {
			if r.Error != "" {
				errs++
				continue
			}
			remaining[r.Remaining]++
			if r.Remaining == want {
				k++
			}
		}
	}
	return k, fmt.Sprintf("via %s: %d of %d kept; remaining -> count %v; item errors %d", n.name, k, counters, remaining, errs)
}

// pollKept waits until at least 99% of the counters are kept, asking
// through each of nodes in turn, and returns how long that took.
func pollKept(t *testing.T, when string, nodes ...*node) time.Duration {
	t.Helper()
	return pollKeptAt(t, when, counterLimit-counterSpent, nodes...)
}

// pollKeptAt is pollKept for counters with want remaining.
func pollKeptAt(t *testing.T, when string, want int64, nodes ...*node) time.Duration {
	t.Helper()
	return poll(t, keepTimeout, when+": >= 99% of counters keep their state", func() (bool, string) {
		var status []string
		for _, n := range nodes {
			k, s := keptAt(n, want)
			status = append(status, s)
			if k*100 < counters*99 {
				return false, fmt.Sprint(status)
			}
		}
		return true, ""
	})
}

// TestScaleOutKeepsCounters: going from two nodes to three moves about a
// third of the keys to the new node, and their counters move with them.
func TestScaleOutKeepsCounters(t *testing.T) {
	c := startCluster(t, 2)
	spend(t, c.nodes[0])
	if k, s := kept(c.nodes[1]); k != counters {
		t.Fatalf("before scaling out, %s", s)
	}

	added := time.Now()
	n := c.add()
	conv := c.waitConverged(3)
	took := pollKept(t, "after scaling 2 -> 3", n, c.nodes[0])
	t.Logf("3rd node converged %v after start; counters kept %v after that (%v after start)",
		conv.Round(time.Millisecond), took.Round(time.Millisecond), time.Since(added).Round(time.Millisecond))

	// The new node owns part of the ring and took counters over: the
	// counters above were found because they moved, not because nothing did.
	ms, err := members(n)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Name == n.name && m.Share <= 0 {
			t.Errorf("the new node owns no part of the ring (share %v): scale-out moved no keys", m.Share)
		}
	}
	received, err := metric(n, "ringlimit_handoff_counters_total", `direction="received"`)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s received %v counters by hand-off", n.name, received)
	if received <= 0 || received >= counters {
		t.Errorf("%s received %v of %d counters by hand-off, want some but not all", n.name, received, counters)
	}
}

// TestSIGTERMKeepsCounters: a SIGTERM'd node leaves, hands its counters to
// the survivors and exits 0 within its shutdown timeout.
func TestSIGTERMKeepsCounters(t *testing.T) {
	c := startCluster(t, 3)
	spend(t, c.nodes[0])
	if k, s := kept(c.nodes[1]); k != counters {
		t.Fatalf("before SIGTERM, %s", s)
	}

	victim := c.nodes[1]
	victim.signal(t, syscall.SIGTERM)
	sent := time.Now()
	if !victim.wait(shutdownTimeout + 5*time.Second) {
		t.Fatalf("%s did not exit within %v of SIGTERM", victim.name, shutdownTimeout+5*time.Second)
	}
	took := victim.exitedAt.Sub(sent)
	t.Logf("%s exited %v after SIGTERM: %v", victim.name, took.Round(time.Millisecond), victim.waitErr)
	if code := victim.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("%s exited with %v, want exit code 0", victim.name, victim.cmd.ProcessState)
	}
	if took > shutdownTimeout {
		t.Errorf("%s took %v to exit, longer than its --shutdown-timeout %v", victim.name, took, shutdownTimeout)
	}

	conv := c.waitConverged(2)
	kt := pollKept(t, "after SIGTERM", c.nodes[0], c.nodes[2])
	t.Logf("survivors converged %v after the exit; counters kept %v after that", conv.Round(time.Millisecond), kt.Round(time.Millisecond))

	// The survivors took the leaver's counters over (the cluster formed
	// before any counter existed, so these are all from the leaver).
	received := 0.0
	for _, n := range []*node{c.nodes[0], c.nodes[2]} {
		v, err := metric(n, "ringlimit_handoff_counters_total", `direction="received"`)
		if err != nil {
			t.Fatal(err)
		}
		received += v
	}
	t.Logf("survivors received %v counters by hand-off", received)
	if received <= 0 || received >= counters {
		t.Errorf("survivors received %v of %d counters by hand-off, want some but not all", received, counters)
	}
}
