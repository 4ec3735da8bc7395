package replica

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

var (
	t0    = time.Unix(1_700_000_000, 0)
	limit = algorithms.Limit{Count: 10, Period: time.Hour}
)

// member is one node's view of the fake cluster: its ring can be changed.
type member struct {
	mu   sync.Mutex
	ring *ring.Ring
	self ring.Member
}

func (m *member) Ring() *ring.Ring {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ring
}
func (m *member) LocalMember() ring.Member { return m.self }
func (m *member) set(r *ring.Ring) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ring = r
}

// call is one Replicate RPC as the fake network saw it.
type call struct {
	to, from string
	counters int
	bytes    int
}

// network delivers Replicate calls to the nodes by peer address, and
// records them; a down address fails.
type network struct {
	mu    sync.Mutex
	nodes map[string]*Node
	down  map[string]bool
	calls []call
}

func (w *network) Replicate(_ context.Context, addr, from string, counters []*peerpb.CounterState) ([]*peerpb.Refusal, error) {
	w.mu.Lock()
	n, down := w.nodes[addr], w.down[addr]
	bytes := 0
	for _, c := range counters {
		bytes += len(c.GetCounter())
	}
	w.calls = append(w.calls, call{to: addr, from: from, counters: len(counters), bytes: bytes})
	w.mu.Unlock()
	if down || n == nil {
		return nil, errors.New("unreachable")
	}
	return n.Receive(from, counters), nil
}

func (w *network) setDown(addr string, down bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.down[addr] = down
}

// taken returns the calls made since the last taken.
func (w *network) taken() []call {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.calls
	w.calls = nil
	return c
}

// cluster is n replica nodes named n0.. over one network, on a clock
// fixed at t0.
type cluster struct {
	net     *network
	members []*member
	nodes   []*Node
	regs    []*prometheus.Registry
	ring    *ring.Ring
}

func newCluster(n int, interval time.Duration) *cluster {
	c := &cluster{net: &network{nodes: map[string]*Node{}, down: map[string]bool{}}}
	var ms []ring.Member
	for i := range n {
		ms = append(ms, ring.Member{Name: fmt.Sprint("n", i), PeerAddr: fmt.Sprint("peer-", i)})
	}
	c.ring = ring.New(ms...)
	for _, m := range ms {
		mem := &member{ring: c.ring, self: m}
		reg := prometheus.NewRegistry()
		node := New(Config{
			Store: limiter.New(limiter.Config{}), Replicas: limiter.New(limiter.Config{}), Cluster: mem, Peers: c.net,
			Interval: interval, Intake: checks.Intake{MaxClockSkew: time.Minute}, Now: func() time.Time { return t0 },
			Registerer: reg,
		})
		c.members = append(c.members, mem)
		c.nodes = append(c.nodes, node)
		c.regs = append(c.regs, reg)
		c.net.nodes[m.PeerAddr] = node
	}
	return c
}

// keysOf returns count keys that node i owns.
func (c *cluster) keysOf(i, count int) []string {
	var keys []string
	for k := 0; len(keys) < count; k++ {
		key := fmt.Sprint("key-", k)
		if o, _ := c.ring.Owner(key); o.Name == c.members[i].self.Name {
			keys = append(keys, key)
		}
	}
	return keys
}

// heirOf returns the index of the node that would own key were its owner
// gone.
func (c *cluster) heirOf(key string) int {
	owner, _ := c.ring.Owner(key)
	heir, _ := c.ring.Without(owner.Name).Owner(key)
	for i, m := range c.members {
		if m.self.Name == heir.Name {
			return i
		}
	}
	panic("no heir")
}

// spend charges hits of key on node i.
func (c *cluster) spend(i int, key string, hits int64) algorithms.Decision {
	r := limiter.Request{Name: "api", Key: key, Algorithm: limiter.TokenBucket, Limit: limit, Hits: hits, Now: t0}
	return c.nodes[i].store.Decide(&r)
}

// remaining peeks at key in s.
func remaining(s *limiter.Store, key string) int64 {
	r := limiter.Request{Name: "api", Key: key, Algorithm: limiter.TokenBucket, Limit: limit, Now: t0}
	return s.Check(&r).Remaining
}

// TestReplicateSendsChangedCountersToHeirs: a round sends each changed
// counter of the node's own keys to the key's heir, and nothing else; the
// heir keeps it apart from its counters.
func TestReplicateSendsChangedCountersToHeirs(t *testing.T) {
	c := newCluster(3, DefaultInterval)
	keys := c.keysOf(0, 40)
	for _, k := range keys {
		c.spend(0, k, 4)
	}
	// A counter node 0 holds for a key it does not own is hand-off's.
	other := c.keysOf(1, 1)[0]
	c.spend(0, other, 1)

	if sent := c.nodes[0].Replicate(t.Context()); sent != len(keys) {
		t.Fatalf("round 1 sent %d counters, want %d", sent, len(keys))
	}
	for _, k := range keys {
		h := c.heirOf(k)
		if got := remaining(c.nodes[h].replicas, heldKey("n0", k)); got != 6 {
			t.Errorf("%s: heir n%d's replica has %d remaining, want 6", k, h, got)
		}
		if c.nodes[h].store.Len() != 0 {
			t.Errorf("heir n%d holds %d counters: replicas must be kept apart", h, c.nodes[h].store.Len())
		}
	}
	if got := c.nodes[0].replicas.Len() + c.nodes[1].replicas.Len() + c.nodes[2].replicas.Len(); got != len(keys) {
		t.Errorf("%d replicas held in all, want %d (one per counter, none of %s)", got, len(keys), other)
	}
	calls := c.net.taken()
	if len(calls) > 2 {
		t.Errorf("round 1 made %d calls, want at most one per heir: %v", len(calls), calls)
	}

	// Nothing changed: nothing sent.
	if sent := c.nodes[0].Replicate(t.Context()); sent != 0 || len(c.net.taken()) != 0 {
		t.Errorf("round 2 with no change sent %d counters", sent)
	}
	// One more hit: that counter alone goes, whole.
	c.spend(0, keys[3], 2)
	if sent := c.nodes[0].Replicate(t.Context()); sent != 1 {
		t.Errorf("round 3 sent %d counters, want 1", sent)
	}
	if got := remaining(c.nodes[c.heirOf(keys[3])].replicas, heldKey("n0", keys[3])); got != 4 {
		t.Errorf("replica after round 3: %d remaining, want 4", got)
	}
	if got := testutil.ToFloat64(c.nodes[0].metrics.counters.WithLabelValues("sent")); got != float64(len(keys)+1) {
		t.Errorf("counters sent metric %v, want %d", got, len(keys)+1)
	}
}

// TestReplicateRepeatedAndStaleBatchesDoNoHarm: a batch received twice, or
// an older one after a newer, leaves the replica at the newest state.
func TestReplicateRepeatedAndStaleBatchesDoNoHarm(t *testing.T) {
	c := newCluster(2, DefaultInterval)
	key := c.keysOf(0, 1)[0]
	c.spend(0, key, 3)
	old := records(t, c.nodes[0].store)
	c.spend(0, key, 4)
	newer := records(t, c.nodes[0].store)
	heir := c.nodes[c.heirOf(key)]
	for _, batch := range [][]*peerpb.CounterState{newer, newer, old} {
		if refused := heir.Receive("n0", batch); len(refused) != 0 {
			t.Fatalf("refused %v", refused)
		}
	}
	if got := remaining(heir.replicas, heldKey("n0", key)); got != 3 {
		t.Errorf("replica has %d remaining after a repeated and a stale batch, want 3", got)
	}
}

// records returns the records of every counter of s.
func records(t *testing.T, s *limiter.Store) []*peerpb.CounterState {
	t.Helper()
	var out []*peerpb.CounterState
	for c := range s.Counters() {
		b, err := c.AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, &peerpb.CounterState{Counter: b})
	}
	return out
}

// TestReplicateBatchesAreBounded: many changed counters go in batches of
// at most peerpb.MaxHandOffCounters counters and MaxHandOffBytes.
func TestReplicateBatchesAreBounded(t *testing.T) {
	c := newCluster(2, DefaultInterval)
	keys := c.keysOf(0, 2*peerpb.MaxHandOffCounters+10)
	for _, k := range keys {
		c.spend(0, k, 1)
	}
	if sent := c.nodes[0].Replicate(t.Context()); sent != len(keys) {
		t.Fatalf("sent %d, want %d", sent, len(keys))
	}
	calls := c.net.taken()
	if len(calls) != 3 {
		t.Errorf("%d calls for %d counters, want 3", len(calls), len(keys))
	}
	for _, cl := range calls {
		if cl.counters > peerpb.MaxHandOffCounters || cl.bytes > peerpb.MaxHandOffBytes {
			t.Errorf("a batch of %d counters, %d bytes: over the bounds", cl.counters, cl.bytes)
		}
	}
	if got := testutil.ToFloat64(c.nodes[0].metrics.batches.WithLabelValues("sent")); got != 3 {
		t.Errorf("batches sent metric %v, want 3", got)
	}
}

// TestReplicateRetriesFailedBatches: counters whose batch failed are sent
// again next round; the lag grows meanwhile.
func TestReplicateRetriesFailedBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(2, DefaultInterval)
		start := time.Now()
		for _, n := range c.nodes {
			n.now = func() time.Time { return t0.Add(time.Since(start)) } // the bubble's clock, from t0
			n.synced.Store(t0.UnixNano())
		}
		keys := c.keysOf(0, 5)
		for _, k := range keys {
			c.spend(0, k, 2)
		}
		c.net.setDown("peer-1", true)
		if sent := c.nodes[0].Replicate(t.Context()); sent != 0 {
			t.Fatalf("sent %d to a down heir", sent)
		}
		time.Sleep(time.Second)
		if lag := c.nodes[0].Lag(); lag < time.Second {
			t.Errorf("lag %v after a second of failed rounds, want at least 1s", lag)
		}
		c.net.setDown("peer-1", false)
		if sent := c.nodes[0].Replicate(t.Context()); sent != len(keys) {
			t.Errorf("after the heir came back, sent %d, want %d", sent, len(keys))
		}
		if lag := c.nodes[0].Lag(); lag != 0 {
			t.Errorf("lag %v after a round that delivered everything, want 0", lag)
		}
		if got := testutil.ToFloat64(c.nodes[0].metrics.batches.WithLabelValues("failed")); got != 1 {
			t.Errorf("failed batches metric %v, want 1", got)
		}
	})
}

// replicated spends 5 of 30 keys of n0 and 1 of 10 keys of n1, so that
// n2 holds replicas of both, and has both replicate; it returns n0's keys.
func (c *cluster) replicated(t *testing.T) []string {
	keys := c.keysOf(0, 30)
	for _, k := range keys {
		c.spend(0, k, 5)
	}
	c.nodes[0].Replicate(t.Context())
	for _, k := range c.keysOf(1, 10) {
		c.spend(1, k, 1)
	}
	c.nodes[1].Replicate(t.Context())
	return keys
}

// TestPromoteOnMemberLoss: when the ring drops a member, the node that
// inherits its keys makes their replicas its counters before deciding
// them, once; replicas of other keys stay replicas.
func TestPromoteOnMemberLoss(t *testing.T) {
	c := newCluster(3, DefaultInterval)
	keys := c.replicated(t)

	without := c.ring.Without("n0")
	promoted := 0
	for i := 1; i < 3; i++ {
		n := c.nodes[i]
		before, own := n.replicas.Len(), n.store.Len()
		n.Promote(without) // not the cluster's ring yet: promotes nothing
		if n.replicas.Len() != before {
			t.Fatalf("n%d promoted for a ring other than its cluster's", i)
		}
		c.members[i].set(without)
		n.Promote(without)
		n.Promote(without) // once per ring
		got := n.store.Len() - own
		promoted += got
		if n.replicas.Len()+got != before {
			t.Errorf("n%d: %d replicas left and %d promoted, of %d replicas", i, n.replicas.Len(), got, before)
		}
		if m := testutil.ToFloat64(n.metrics.promoted); m != float64(got) {
			t.Errorf("n%d: promoted metric %v, %d promoted", i, m, got)
		}
	}
	if promoted != len(keys) {
		t.Errorf("%d counters promoted, want the %d of n0", promoted, len(keys))
	}
	for _, k := range keys {
		owner, _ := without.Owner(k)
		n := c.nodes[map[string]int{"n1": 1, "n2": 2}[owner.Name]]
		if got := remaining(n.store, k); got != 5 {
			t.Errorf("%s on its new owner %s: %d remaining, want 5", k, owner.Name, got)
		}
	}
}

// TestRunResendsOnRingChange: Run replicates each interval, and after a
// ring change sends again the counters whose heir changed, to their new
// heir, and only those.
func TestRunResendsOnRingChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(3, DefaultInterval)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.nodes[0].Run(ctx)
		}()
		keys := c.keysOf(0, 60)
		for _, k := range keys {
			c.spend(0, k, 1)
		}
		time.Sleep(DefaultInterval + time.Millisecond)
		synctest.Wait()
		if got := sum(c.net.taken()); got != len(keys) {
			t.Fatalf("first interval sent %d counters, want %d", got, len(keys))
		}
		time.Sleep(DefaultInterval)
		synctest.Wait()
		if got := sum(c.net.taken()); got != 0 {
			t.Fatalf("an interval with no change sent %d counters", got)
		}
		// n3 joins.
		grown := ring.New(append(c.ring.Members(), ring.Member{Name: "n3", PeerAddr: "peer-3"})...)
		heirs := map[string]int{} // new heir's address -> counters whose heir changed to it
		for _, k := range keys {
			if o, _ := grown.Owner(k); o.Name != "n0" {
				continue // hand-off's now
			}
			was, _ := c.ring.Without("n0").Owner(k)
			now, _ := grown.Without("n0").Owner(k)
			if was.Name != now.Name {
				heirs[now.PeerAddr]++
			}
		}
		if len(heirs) == 0 {
			t.Fatal("no heir changed: the test shows nothing")
		}
		c.members[0].set(grown)
		c.nodes[0].RingChanged()
		time.Sleep(DefaultInterval)
		synctest.Wait()
		got := map[string]int{}
		for _, cl := range c.net.taken() {
			got[cl.to] += cl.counters
		}
		if fmt.Sprint(got) != fmt.Sprint(heirs) {
			t.Errorf("after the ring change sent %v (heir address: counters), want %v", got, heirs)
		}
		cancel()
		<-done
	})
}

func sum(calls []call) int {
	n := 0
	for _, c := range calls {
		n += c.counters
	}
	return n
}

// TestZeroIntervalSendsNothing: with replication off a node sends nothing
// but still keeps and promotes what others send.
func TestZeroIntervalSendsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(2, 0)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.nodes[0].Run(ctx)
		}()
		c.spend(0, c.keysOf(0, 1)[0], 1)
		time.Sleep(time.Second)
		synctest.Wait()
		if calls := c.net.taken(); len(calls) != 0 {
			t.Errorf("replication off, yet %d calls", len(calls))
		}
		if lag := c.nodes[0].Lag(); lag != 0 {
			t.Errorf("lag %v with replication off, want 0", lag)
		}
		cancel()
		<-done
	})
}

// TestIdleReplicasAreDropped: a replica whose counter is full again by
// now carries nothing, and goes as idle counters do, when new replicas
// arrive.
func TestIdleReplicasAreDropped(t *testing.T) {
	c := newCluster(2, DefaultInterval)
	heir := c.nodes[1]
	heir.replicas = limiter.New(limiter.Config{MaxKeys: 1000}) // one shard, so that new replicas meet the idle ones
	now := t0
	heir.now = func() time.Time { return now }
	keys := c.keysOf(0, 10)
	for _, k := range keys[:5] {
		c.spend(0, k, 1)
	}
	c.nodes[0].Replicate(t.Context())
	if got := heir.replicas.Len(); got != 5 {
		t.Fatalf("%d replicas, want 5", got)
	}
	// Two hours later the hour-long buckets are full again; new replicas
	// push the idle ones out.
	now = t0.Add(2 * time.Hour)
	later := limiter.New(limiter.Config{})
	for _, k := range keys[5:] {
		r := limiter.Request{Name: "api", Key: k, Algorithm: limiter.TokenBucket, Limit: limit, Hits: 1, Now: now}
		later.Decide(&r)
	}
	if refused := heir.Receive("n0", records(t, later)); len(refused) != 0 {
		t.Fatalf("refused %v", refused)
	}
	if got := heir.replicas.Len(); got != 5 {
		t.Errorf("%d replicas after 5 new ones arrived two hours later, want the 5 new ones only", got)
	}
}

// TestPromoteOnlyTheOwnersReplicas: each heir holds two replicas of each
// of n0's keys: n0's own (2 hits spent) and a spent one planted by the
// third node, which does not own the key. When n0 leaves the ring, each
// heir promotes n0's replica alone; the planted one stays a replica, and
// stays one when its sender leaves the ring too, as it never owned the
// key. A replica is promoted under its key, not under the key it is kept
// under. (On main, each heir promoted both, and n0's keys were spent.)
func TestPromoteOnlyTheOwnersReplicas(t *testing.T) {
	c := newCluster(3, DefaultInterval)
	keys := c.keysOf(0, 30)
	spent := limiter.New(limiter.Config{})
	for _, k := range keys {
		c.spend(0, k, 2)
		r := limiter.Request{Name: "api", Key: k, Algorithm: limiter.TokenBucket, Limit: limit, Hits: limit.Count, Now: t0}
		spent.Decide(&r)
	}
	c.nodes[0].Replicate(t.Context())
	planters := map[int]string{1: "n2", 2: "n1"} // the heir's other node
	for h, from := range planters {
		if refused := c.nodes[h].Receive(from, records(t, spent)); len(refused) != 0 {
			t.Fatalf("refused %v", refused)
		}
	}

	without := c.ring.Without("n0")
	for h := range planters {
		c.members[h].set(without)
		c.nodes[h].Promote(without)
	}
	for _, k := range keys {
		owner, _ := without.Owner(k)
		n := c.nodes[map[string]int{"n1": 1, "n2": 2}[owner.Name]]
		if got := remaining(n.store, k); got != limit.Count-2 {
			t.Errorf("%s on its new owner %s: %d remaining, want %d, n0's replica", k, owner.Name, got, limit.Count-2)
		}
	}

	// Then the planter leaves: the keys the heir took from n0 stay as n0
	// left them. (Those of n0's keys the planter had come to own are the
	// planter's to replicate, truly or not, as for any key it owns.)
	for h, from := range planters {
		alone := without.Without(from)
		c.members[h].set(alone)
		c.nodes[h].Promote(alone)
		for _, k := range keys {
			if owner, _ := without.Owner(k); owner.Name != c.members[h].self.Name {
				continue
			}
			if got := remaining(c.nodes[h].store, k); got != limit.Count-2 {
				t.Errorf("%s on n%d after %s, which never owned it, left: %d remaining, want %d", k, h, from, got, limit.Count-2)
			}
		}
	}
}

// TestReturnToAMemberThatCameBack: a member that comes back to the ring,
// or a new process under its name (another Boot), gets back the replicas
// it sent of the keys it owns: they become counters of the heir's store,
// which its hand-off sends on. The others' replicas stay, and a member
// whose process did not change gets nothing.
func TestReturnToAMemberThatCameBack(t *testing.T) {
	c := newCluster(3, DefaultInterval)
	keys := c.replicated(t)
	ms := c.ring.Members()
	restarted := slices.Clone(ms)
	restarted[0].Boot = "another"
	back := ring.New(restarted...)
	returned := 0
	for i := 1; i < 3; i++ {
		n := c.nodes[i]
		if got := n.Return(c.ring, ring.New(ms...)); got != 0 {
			t.Errorf("n%d gave back %d replicas with no member back", i, got)
		}
		before, own := n.replicas.Len(), n.store.Len()
		got := n.Return(c.ring, back)
		returned += got
		if n.store.Len()-own != got || n.replicas.Len() != before-got {
			t.Errorf("n%d: %d given back, its store grew by %d, its replicas fell by %d", i, got, n.store.Len()-own, before-n.replicas.Len())
		}
		for _, k := range keys {
			if c.heirOf(k) == i && remaining(n.store, k) != 5 {
				t.Errorf("%s on its heir n%d: %d remaining, want 5, to give back", k, i, remaining(n.store, k))
			}
		}
	}
	if returned != len(keys) {
		t.Errorf("%d replicas given back, want the %d of n0", returned, len(keys))
	}
	without := c.ring.Without("n0")
	for _, k := range c.keysOf(1, 10) {
		c.spend(1, k, 1)
	}
	c.nodes[1].Replicate(t.Context()) // replicas of n1 on n0 and n2
	if got := c.nodes[2].Return(without, c.ring); got != 0 {
		t.Errorf("n2 gave back %d replicas to n0, back in the ring with none of its own there", got)
	}
}

// TestFollowResendsToAHeirThatStartedAgain: an heir that is a new process
// under its name (another Boot) has lost the replicas it kept: the next
// round sends every counter whose heir it is again.
func TestFollowResendsToAHeirThatStartedAgain(t *testing.T) {
	c := newCluster(3, DefaultInterval)
	keys := c.keysOf(0, 30)
	for _, k := range keys {
		c.spend(0, k, 5)
	}
	c.nodes[0].Replicate(t.Context())
	c.net.taken()
	ms := c.ring.Members()
	ms[1].Boot = "another"
	c.members[0].set(ring.New(ms...))
	c.nodes[0].Replicate(t.Context())
	sent := 0
	for _, call := range c.net.taken() {
		if call.to != "peer-1" {
			t.Errorf("a round sent %d counters to %s, whose process did not change", call.counters, call.to)
		}
		sent += call.counters
	}
	want := 0
	for _, k := range keys {
		if c.heirOf(k) == 1 {
			want++
		}
	}
	if sent != want {
		t.Errorf("%d counters sent again to n1, started again; want the %d it is the heir of", sent, want)
	}
}
