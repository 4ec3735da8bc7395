package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/node"
	"github.com/ringlimit/ringlimit/service"
)

// testCluster is several nodes in this test process, on loopback, with
// real memberlist and real gRPC.
type testCluster struct {
	nodes   []*node.Node
	stops   []func() error
	clients []*client.Client
}

// startCluster starts n nodes, each joining the first, and waits until
// every node's ring has n members.
func startCluster(t testing.TB, n int, args ...string) *testCluster {
	t.Helper()
	c := &testCluster{}
	for i := range n {
		c.add(t, args...)
		_ = i
	}
	c.waitForMembers(t, n)
	return c
}

// add starts one more node that joins the first.
func (c *testCluster) add(t testing.TB, args ...string) {
	t.Helper()
	if len(c.nodes) > 0 {
		args = append([]string{"--join", c.nodes[0].Cluster().GossipAddr()}, args...)
	}
	n, stop := startNamedNode(t, fmt.Sprintf("node-%d", len(c.nodes)), args...)
	cl, err := client.New(n.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	c.nodes, c.stops, c.clients = append(c.nodes, n), append(c.stops, stop), append(c.clients, cl)
}

// waitForMembers polls until every running node sees want members.
func (c *testCluster) waitForMembers(t testing.TB, want int, skip ...int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok := true
		for i, n := range c.nodes {
			if contains(skip, i) {
				continue
			}
			ok = ok && n.Cluster().Ring().Len() == want && n.Cluster().Ready()
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			var lens []string
			for _, n := range c.nodes {
				lens = append(lens, fmt.Sprintf("%d/%v", n.Cluster().Ring().Len(), n.Cluster().Ready()))
			}
			t.Fatalf("cluster did not converge on %d members within 20s: rings %v", want, lens)
		}
		time.Sleep(20 * time.Millisecond) // polling, not waiting for an effect
	}
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// burst sends total concurrent checks of one hit on key, spread evenly
// over the nodes, and returns how many were admitted.
func (c *testCluster) burst(t *testing.T, item *pb.CheckItem, total int) int {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	const workers = 150
	for w := range workers {
		wg.Go(func() {
			cl := c.clients[w%len(c.clients)]
			for range total / workers {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := cl.Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
				cancel()
				if err != nil {
					t.Errorf("check: %v", err)
					return
				}
				r := resp.Responses[0]
				if r.Error != "" {
					t.Errorf("check: %s", r.Error)
				}
				if r.Status == pb.Status_UNDER_LIMIT {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return int(admitted.Load())
}

func TestClusterIsExact(t *testing.T) {
	c := startCluster(t, 3)
	for _, behavior := range []pb.Behavior{pb.Behavior_BATCHED, pb.Behavior_UNBATCHED} {
		item := &pb.CheckItem{Name: "burst", Key: "hot:" + behavior.String(), Limit: 100, DurationMs: 3_600_000, Behavior: behavior}
		if got := c.burst(t, item, 1500); got != 100 {
			t.Errorf("%v: 1500 concurrent checks over 3 nodes admitted %d, want exactly 100", behavior, got)
		}
	}
}

// TestClusterSpacingIsExact: a spaced check is forwarded whole to its
// key's owner over real gRPC, which keeps the spacing: of 300 concurrent
// checks over 3 nodes one is admitted in the interval, though the limit
// would admit 100.
func TestClusterSpacingIsExact(t *testing.T) {
	c := startCluster(t, 3)
	for _, behavior := range []pb.Behavior{pb.Behavior_BATCHED, pb.Behavior_UNBATCHED} {
		item := &pb.CheckItem{Name: "spaced", Key: "hot:" + behavior.String(), Limit: 100, DurationMs: 3_600_000,
			MinIntervalMs: 3_600_000, Behavior: behavior}
		if got := c.burst(t, item, 300); got != 1 {
			t.Errorf("%v: 300 concurrent spaced checks over 3 nodes admitted %d, want exactly 1", behavior, got)
		}
	}
}

// TestClusterBorrowing: six tenants, each guaranteed 10 an hour and
// borrowing up to 100 from one parent of 200, checked 3,000 times at once
// through three real nodes (gRPC, memberlist, GLOBAL rounds every 100ms).
// Every guarantee is admitted, and, cluster-wide, the tenants borrow no
// more than the parent holds. (The burst is over within a round or two,
// so the guaranteed hits of other nodes reach the parent's owner after
// the borrowers have taken its room: the bound docs/checks.md states,
// the parent plus the guarantees admitted away from its owner in a round,
// is then the parent plus all of them.) A check the key's owner did not
// decide (decided_by "failover" or "fallback": the owner did not answer
// within the forward deadline, as on a machine too busy for it; in one
// loaded run of the whole suite, tenant 0 had 19 admitted outside the
// borrowing) is counted apart and logged: those decisions are on a
// replica or a share, by the rules of docs/cluster.md, not the
// borrowing's.
func TestClusterBorrowing(t *testing.T) {
	const tenants, guarantee, parent = 6, 10, 200
	c := startCluster(t, 3)
	var guaranteed, borrowed [tenants]atomic.Int64
	var mu sync.Mutex
	elsewhere := map[string]int{} // admitted checks the owner did not decide, by decided_by
	var wg sync.WaitGroup
	const workers, each = 150, 20
	for w := range workers {
		wg.Go(func() {
			cl := c.clients[w%len(c.clients)]
			for i := range each {
				k := (w + i) % tenants
				item := &pb.CheckItem{Name: "api", Key: fmt.Sprint("tenant:", k), Limit: guarantee, DurationMs: 3_600_000,
					Algorithm: pb.Algorithm_FIXED_WINDOW, Ceiling: 100, Parent: &pb.ParentLimit{Key: "all", Limit: parent}}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := cl.Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
				cancel()
				if err != nil || resp.Responses[0].Error != "" {
					t.Errorf("check: %v %v", resp, err)
					return
				}
				switch r := resp.Responses[0]; {
				case r.Status != pb.Status_UNDER_LIMIT:
				case r.Metadata[service.MetadataDecidedBy] != "":
					mu.Lock()
					elsewhere[r.Metadata[service.MetadataDecidedBy]]++
					mu.Unlock()
				case r.Borrowed:
					borrowed[k].Add(1)
				default:
					guaranteed[k].Add(1)
				}
			}
		})
	}
	wg.Wait()
	var total int64
	for k := range tenants {
		if got := guaranteed[k].Load(); got != guarantee {
			t.Errorf("tenant %d: %d admitted within its guarantee, want all %d", k, got, guarantee)
		}
		total += borrowed[k].Load()
	}
	t.Logf("borrowed %d in all (the parent holds %d, the guarantees %d of it)", total, parent, tenants*guarantee)
	for by, n := range elsewhere {
		t.Logf("%d admitted by %q, not by the key's owner: the owner did not answer in time", n, by)
	}
	if total == 0 || total > parent {
		t.Errorf("borrowed %d in all, want some and at most the parent's %d", total, parent)
	}
}

// spend charges half of each of n counters, through node 0.
func (c *testCluster) spend(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		item := &pb.CheckItem{Name: "handoff", Key: fmt.Sprint("user:", i), Limit: 10, DurationMs: 3_600_000, Hits: ptr(int64(5))}
		resp, err := c.clients[0].Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
		if err != nil || resp.Responses[0].Status != pb.Status_UNDER_LIMIT {
			t.Fatalf("spend %d: %v %v", i, resp, err)
		}
	}
}

// kept returns how many of n counters still have 5 remaining, asking
// through the given client.
func kept(t *testing.T, cl *client.Client, n int) int {
	t.Helper()
	k := 0
	for i := range n {
		item := &pb.CheckItem{Name: "handoff", Key: fmt.Sprint("user:", i), Limit: 10, DurationMs: 3_600_000, Hits: ptr(int64(0))}
		resp, err := cl.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
		if err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
		if resp.Responses[0].Remaining == 5 {
			k++
		}
	}
	return k
}

func ptr[T any](v T) *T { return &v }

func TestCountersSurviveScaleOutAndShutdown(t *testing.T) {
	const counters = 600
	c := startCluster(t, 2)
	c.spend(t, counters)

	c.add(t)
	c.waitForMembers(t, 3)
	// Hand-off is asynchronous: poll until the new owner has the counters.
	pollKept(t, c.clients[2], counters, "after scaling 2 -> 3")

	// A SIGTERM'd node leaves, hands off and exits; ask the survivors.
	if err := c.stops[1](); err != nil {
		t.Fatalf("stopping node 1: %v", err)
	}
	c.waitForMembers(t, 2, 1)
	pollKept(t, c.clients[2], counters, "after node 1 shut down")
}

func pollKept(t *testing.T, cl *client.Client, n int, when string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		k := kept(t, cl, n)
		if k*100 >= n*99 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d counters kept their state, want >= 99%%", when, k, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestMembersShowsReplicas: rlnode members reads, from each alive member's
// metrics, the replicas of other nodes' counters it holds; every counter
// spent is replicated once, so the column sums to the counters.
func TestMembersShowsReplicas(t *testing.T) {
	c := startCluster(t, 3)
	c.spend(t, 30)
	var out strings.Builder
	deadline := time.Now().Add(10 * time.Second)
	for {
		out.Reset()
		if err := run(context.Background(), []string{"members", "--addr", c.nodes[0].HTTPAddr()}, env(nil), &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		sum, rows := 0, 0
		for line := range strings.Lines(out.String()) {
			fields := strings.Fields(line)
			if len(fields) == 0 || fields[0] == "NAME" {
				continue
			}
			n, err := strconv.Atoi(fields[len(fields)-1])
			if err != nil {
				t.Fatalf("REPLICAS column %q: %v\n%s", fields[len(fields)-1], err, out.String())
			}
			sum += n
			rows++
		}
		if rows == 3 && sum == 30 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rlnode members shows %d rows, %d replicas in all; want 3 rows and 30 within 10s:\n%s", rows, sum, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
