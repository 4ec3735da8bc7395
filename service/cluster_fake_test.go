package service

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/ring"
)

// fakeCluster is several services in one process, joined by direct calls
// instead of gRPC, so that protocol tests are deterministic. Real gRPC and
// memberlist are exercised by the tests in cmd/rlnode and e2e.
type fakeCluster struct {
	ring *ring.Ring
	// views holds, by node name, a ring that node sees instead of ring,
	// as a node does before gossip tells it of a change.
	views sync.Map
	nodes map[string]*Service // by peer address
	down  map[string]bool     // peer addresses that do not answer
	// frozen holds peer addresses (keys; any value) that hang, as a
	// stopped process does, until the call's context ends or
	// fakeForwardDeadline passes. Unlike down it may change while calls
	// are in flight.
	frozen sync.Map
	// onDown, if set, is called when a call reaches a down peer, before it
	// fails: a test can change the ring as the call is in flight.
	onDown func(addr string)
	// onHandOff, if set, sees (and may alter) every hand-off in flight.
	onHandOff func(counters []*peerpb.CounterState)
	// onUpdate, if set, sees every GLOBAL broadcast in flight.
	onUpdate func(from string, states []*peerpb.GlobalState)
	// onRing, if set, is called as node name reads its ring: a test can
	// hold a call of it there, mid-way through what it is doing.
	onRing func(name string)
	// joining holds the names (keys; any value) of nodes that have not
	// joined yet: their Ready reports false.
	joining sync.Map
	// replicas holds each node's store of replicas, by peer address.
	replicas map[string]*limiter.Store
}

type fakeMember struct {
	c    *fakeCluster
	self ring.Member
}

func (m fakeMember) Ring() *ring.Ring {
	if m.c.onRing != nil {
		m.c.onRing(m.self.Name)
	}
	if r, ok := m.c.views.Load(m.self.Name); ok {
		return r.(*ring.Ring)
	}
	return m.c.ring
}
func (m fakeMember) LocalMember() ring.Member { return m.self }
func (m fakeMember) Ready() bool {
	_, joining := m.c.joining.Load(m.self.Name)
	return !joining
}
func (fakeMember) Returning() []string { return nil }

// fakeForwardDeadline is the fake's forward deadline, peer.Pool's default.
const fakeForwardDeadline = 2 * time.Second

func (c *fakeCluster) peer(ctx context.Context, addr string) (Owner, error) {
	if err := ctx.Err(); err != nil {
		return Owner{}, err
	}
	if _, ok := c.frozen.Load(addr); ok {
		select {
		case <-ctx.Done():
		case <-time.After(fakeForwardDeadline):
		}
		return Owner{}, fmt.Errorf("%s: %w: %w", addr, peer.ErrUnreachable, context.DeadlineExceeded)
	}
	if c.down[addr] {
		if c.onDown != nil {
			c.onDown(addr)
		}
		return Owner{}, fmt.Errorf("%s: %w", addr, context.DeadlineExceeded)
	}
	return c.nodes[addr].Owner(), nil
}

func (c *fakeCluster) Forward(ctx context.Context, addr string, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	o, err := c.peer(ctx, addr)
	if err != nil {
		return nil, err
	}
	return o.Forwarded(ctx, []*pb.CheckRequest{req})[0], nil
}

// Start is Forward, started in a goroutine of its own: the service waits
// for it as it waits for a real batched forward.
func (c *fakeCluster) Start(ctx context.Context, addr string, req *pb.CheckRequest) peer.Forwarding {
	ctx, cancel := context.WithCancel(ctx)
	f := &fakeForwarding{done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(f.done)
		f.resp, f.err = c.Forward(ctx, addr, req)
	}()
	return f
}

// fakeForwarding is a fakeCluster forward on its way.
type fakeForwarding struct {
	done   chan struct{}
	cancel context.CancelFunc // makes a frozen peer give up
	resp   *pb.CheckResponse
	err    error
}

func (f *fakeForwarding) Wait(stop <-chan struct{}) (*pb.CheckResponse, error) {
	defer f.cancel()
	select {
	case <-f.done:
		return f.resp, f.err
	case <-stop:
		f.cancel()
		<-f.done // a peer that hangs gives up at once; one that answers has decided
		return nil, fmt.Errorf("fake forward: %w: stopped", peer.ErrUnreachable)
	}
}

func (c *fakeCluster) ForwardNow(ctx context.Context, addr string, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	return c.Forward(ctx, addr, req)
}

func (c *fakeCluster) Relay(ctx context.Context, addr string, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	o, err := c.peer(ctx, addr)
	if err != nil {
		return nil, err
	}
	return o.Relayed(ctx, []*pb.CheckRequest{req})[0], nil
}

func (c *fakeCluster) Pull(ctx context.Context, addr string, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	o, err := c.peer(ctx, addr)
	if err != nil {
		return nil, err
	}
	resps, err := o.Pulled(ctx, []*pb.CheckRequest{req})
	if err != nil {
		return nil, err
	}
	return resps[0], nil
}

func (c *fakeCluster) AddGlobalHits(ctx context.Context, addr, from string, reports []*peerpb.GlobalReport) error {
	o, err := c.peer(ctx, addr)
	if err != nil {
		return err
	}
	return o.AddGlobalHits(ctx, from, reports)
}

func (c *fakeCluster) UpdateGlobals(ctx context.Context, addr, from string, states []*peerpb.GlobalState) error {
	o, err := c.peer(ctx, addr)
	if err != nil {
		return err
	}
	if c.onUpdate != nil {
		c.onUpdate(from, states)
	}
	return o.UpdateGlobals(ctx, from, states)
}

func (c *fakeCluster) HandOff(ctx context.Context, addr, from string, counters []*peerpb.CounterState) ([]*peerpb.Refusal, error) {
	o, err := c.peer(ctx, addr)
	if err != nil {
		return nil, err
	}
	if c.onHandOff != nil {
		c.onHandOff(counters)
	}
	return o.HandOff(ctx, from, counters), nil
}

func (c *fakeCluster) HandOffDone(ctx context.Context, addr, from string, ring uint64) error {
	o, err := c.peer(ctx, addr)
	if err != nil {
		return err
	}
	o.HandOffDone(ctx, from, ring)
	return nil
}

func (c *fakeCluster) HandOffLeft(ctx context.Context, addr, from string, ring uint64) error {
	o, err := c.peer(ctx, addr)
	if err != nil {
		return err
	}
	o.HandOffDone(ctx, from, ring)
	return o.Left(ctx, from, ring)
}

func (c *fakeCluster) Replicate(ctx context.Context, addr, from string, counters []*peerpb.CounterState) ([]*peerpb.Refusal, error) {
	o, err := c.peer(ctx, addr)
	if err != nil {
		return nil, err
	}
	return o.Replicate(ctx, from, counters), nil
}

func (c *fakeCluster) Lease(ctx context.Context, addr, from string, lessee []byte, reports []*pb.LeaseReport) ([]*pb.LeaseGrant, error) {
	o, err := c.peer(ctx, addr)
	if err != nil {
		return nil, err
	}
	return o.Lease(ctx, from, lessee, reports)
}

func (c *fakeCluster) Settle(ctx context.Context, addr, from string, req *pb.SettleRequest) (*pb.SettleResponse, error) {
	o, err := c.peer(ctx, addr)
	if err != nil {
		return nil, err
	}
	resp, err := o.Settle(ctx, from, req)
	if err != nil { // as peer.Server answers it
		return nil, status.Error(checks.Code(err), err.Error())
	}
	return resp, nil
}

// newFakeCluster returns n services named node-0.. on a fixed clock.
func newFakeCluster(n int) (*fakeCluster, []*Service) {
	return newFakeClusterWith(n, func(int) Config { return Config{} })
}

// newFakeClusterWith is newFakeCluster with each node's Config from
// conf(i), to which it adds the cluster, the peers and, unless conf set
// one, the fixed clock.
func newFakeClusterWith(n int, conf func(i int) Config) (*fakeCluster, []*Service) {
	c := &fakeCluster{nodes: map[string]*Service{}, down: map[string]bool{}, replicas: map[string]*limiter.Store{}}
	var members []ring.Member
	for i := range n {
		members = append(members, ring.Member{Name: fmt.Sprint("node-", i), PeerAddr: fmt.Sprint("peer-", i)})
	}
	c.ring = ring.New(members...)
	var svcs []*Service
	for i, m := range members {
		cf := conf(i)
		cf.Cluster, cf.Peers = fakeMember{c, m}, c
		if cf.Now == nil {
			cf.Now = fixedClock(t0)
		}
		if cf.Replicas == nil {
			cf.Replicas = limiter.New(limiter.Config{})
		}
		c.replicas[m.PeerAddr] = cf.Replicas
		s := New(cf)
		c.nodes[m.PeerAddr] = s
		svcs = append(svcs, s)
	}
	return c, svcs
}

// newFakeClusterMetered is newFakeCluster with node watched's metrics in
// the registry it returns.
func newFakeClusterMetered(n, watched int) (*fakeCluster, []*Service, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	c, svcs := newFakeClusterWith(n, func(i int) Config {
		if i == watched {
			return Config{Registerer: reg}
		}
		return Config{}
	})
	return c, svcs, reg
}

// keyOwnedBy returns a key that the ring gives to node i.
func (c *fakeCluster) keyOwnedBy(i int) string {
	for k := 0; ; k++ {
		key := fmt.Sprint("key-", k)
		if o, _ := c.ring.Owner(key); o.Name == fmt.Sprint("node-", i) {
			return key
		}
	}
}

// keyInheritedBy returns a key that the ring gives to node owner and,
// without owner, to node heir.
func (c *fakeCluster) keyInheritedBy(owner, heir int) string {
	without := c.ring.Without(fmt.Sprint("node-", owner))
	for k := 0; ; k++ {
		key := fmt.Sprint("key-", k)
		o, _ := c.ring.Owner(key)
		h, _ := without.Owner(key)
		if o.Name == fmt.Sprint("node-", owner) && h.Name == fmt.Sprint("node-", heir) {
			return key
		}
	}
}

// TestUnreachableOwnerFailsOverToTheHeir: an owner that cannot be reached
// has its keys decided by their heir, on the replica the owner sent it,
// with the whole limit: the key goes on from where the replica left it,
// and across the cluster no more than the limit is admitted.
func TestUnreachableOwnerFailsOverToTheHeir(t *testing.T) {
	c, svcs := newFakeCluster(3)
	key := c.keyInheritedBy(2, 1)
	item := &pb.CheckItem{Name: "api", Key: key, Limit: 10, DurationMs: 60_000}
	for range 4 {
		check(t, svcs[0], item)
	}
	if sent := svcs[2].custody.Replicate(t.Context()); sent != 1 {
		t.Fatalf("node-2 replicated %d counters, want 1", sent)
	}
	c.down["peer-2"] = true
	admitted := 0
	for i := range 20 {
		r := check(t, svcs[i%2], item)
		if r.Metadata[MetadataDecidedBy] != routeFailover || r.Limit != 10 {
			t.Fatalf("check %d with the owner down: %v; want decided by failover with the whole limit", i, r)
		}
		if r.Status == pb.Status_UNDER_LIMIT {
			admitted++
		}
	}
	if admitted != 6 {
		t.Errorf("admitted %d with the owner down after 4 before, want the 6 left on the replica", admitted)
	}
}

// syncRound runs one GLOBAL round on every node: reports, then broadcasts.
func syncRound(svcs []*Service) {
	for _, s := range svcs {
		s.global.Report(context.Background())
	}
	for _, s := range svcs {
		s.global.Broadcast(context.Background())
	}
}

func check(t *testing.T, s *Service, item *pb.CheckItem) *pb.CheckResult {
	t.Helper()
	resp, err := s.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Responses[0]; r.Error != "" {
		t.Fatalf("check: %s", r.Error)
	}
	return resp.Responses[0]
}

func TestForwardedChecksAreDecidedByTheOwner(t *testing.T) {
	c, svcs := newFakeCluster(3)
	item := &pb.CheckItem{Name: "api", Key: c.keyOwnedBy(2), Limit: 10, DurationMs: 60_000}
	admitted := 0
	for i := range 30 {
		if check(t, svcs[i%3], item).Status == pb.Status_UNDER_LIMIT {
			admitted++
		}
	}
	if admitted != 10 {
		t.Errorf("admitted %d over 3 nodes, want exactly 10", admitted)
	}
	if n := svcs[0].store.Len() + svcs[1].store.Len(); n != 0 {
		t.Errorf("non-owners hold %d counters, want 0", n)
	}
}

// TestUnreachableOwnerFallsBackToShare: an owner that cannot be reached,
// and whose key's heir cannot be reached either, leaves this node to decide
// with its share.
func TestUnreachableOwnerFallsBackToShare(t *testing.T) {
	c, svcs := newFakeCluster(3)
	c.down["peer-2"] = true
	c.down["peer-1"] = true
	item := &pb.CheckItem{Name: "api", Key: c.keyInheritedBy(2, 1), Limit: 30, DurationMs: 60_000}
	admitted := 0
	for range 20 {
		r := check(t, svcs[0], item)
		if r.Metadata[MetadataDecidedBy] != routeFallback.String() {
			t.Fatalf("result without fallback metadata: %v", r)
		}
		if r.Status == pb.Status_UNDER_LIMIT {
			admitted++
		}
	}
	if admitted != 10 {
		t.Errorf("node 0 admitted %d with the owner down, want its share 30/3 = 10", admitted)
	}
}

// TestGlobalNeverExceedsLimit drives GLOBAL checks at every node between
// sync rounds, including while grants are outstanding, and checks the
// cluster never admits more than the limit; then that it admits all of it.
func TestGlobalNeverExceedsLimit(t *testing.T) {
	c, svcs := newFakeCluster(3)
	item := &pb.CheckItem{Name: "api", Key: c.keyOwnedBy(1), Limit: 100, DurationMs: 3_600_000, Behavior: pb.Behavior_GLOBAL}
	admitted := 0
	for round := range 20 {
		for i := range 30 {
			if check(t, svcs[(i+round)%3], item).Status == pb.Status_UNDER_LIMIT {
				admitted++
			}
		}
		syncRound(svcs)
	}
	if admitted != 100 {
		t.Errorf("GLOBAL admitted %d over 20 rounds of 30 checks, want exactly 100", admitted)
	}
	// After the rounds, the owner's counter holds every hit.
	peek := &pb.CheckItem{Name: "api", Key: item.Key, Limit: 100, DurationMs: 3_600_000, Hits: new(int64)}
	if r := check(t, svcs[1], peek); r.Remaining != 0 {
		t.Errorf("owner's counter has %d remaining, want 0", r.Remaining)
	}
}

// TestGlobalGrantsAnswerLocally: once a node holds a grant it answers
// from it, with the owner unreachable; its hits reach the owner with the
// next round; and an idle node gives its grant back, so that the owner can
// admit everything that is left.
func TestGlobalGrantsAnswerLocally(t *testing.T) {
	c, svcs := newFakeCluster(2)
	item := &pb.CheckItem{Name: "api", Key: c.keyOwnedBy(1), Limit: 1000, DurationMs: 3_600_000, Behavior: pb.Behavior_GLOBAL}
	check(t, svcs[0], item) // no grant yet: forwarded, and asks for one
	syncRound(svcs)
	c.down["peer-1"] = true // the owner cannot be asked: answers must come from the grant
	for range 50 {
		if r := check(t, svcs[0], item); r.Status != pb.Status_UNDER_LIMIT || r.Metadata[MetadataDecidedBy] != "" {
			t.Fatalf("check with a grant: %v, want admitted by node 0 itself", r)
		}
	}
	c.down["peer-1"] = false
	// A round reports the hits to the owner.
	syncRound(svcs)
	peek := &pb.CheckItem{Name: "api", Key: item.Key, Limit: 1000, DurationMs: 3_600_000, Hits: new(int64), Behavior: pb.Behavior_GLOBAL}
	if r := check(t, svcs[1], peek); r.Remaining > 1000-51 {
		t.Errorf("owner reports %d remaining after 51 hits elsewhere", r.Remaining)
	}
	// Idle for a round: node 0 gives its grant back, and the owner can
	// admit all that is left in one check.
	syncRound(svcs)
	syncRound(svcs)
	rest := &pb.CheckItem{Name: "api", Key: item.Key, Limit: 1000, DurationMs: 3_600_000, Hits: hits(1000 - 51), Behavior: pb.Behavior_GLOBAL}
	if r := check(t, svcs[1], rest); r.Status != pb.Status_UNDER_LIMIT {
		t.Errorf("owner refuses the %d hits left after node 0 went idle: %v; the grant was not given back", 1000-51, r)
	}
}

// TestGlobalGrantsOfDepartedNodesAreFreed: a node that leaves the cluster
// (or dies) with a grant must not keep the owner from lending, or
// admitting, those hits.
func TestGlobalGrantsOfDepartedNodesAreFreed(t *testing.T) {
	c, svcs := newFakeCluster(3)
	smaller := ring.New(c.ring.Members()[1:]...) // without node-0
	var key string
	for k := 0; ; k++ {
		key = fmt.Sprint("key-", k)
		a, _ := c.ring.Owner(key)
		b, _ := smaller.Owner(key)
		if a.Name == "node-1" && b.Name == "node-1" {
			break
		}
	}
	item := &pb.CheckItem{Name: "api", Key: key, Limit: 900, DurationMs: 3_600_000, Behavior: pb.Behavior_GLOBAL}
	check(t, svcs[0], item) // forwarded; asks for a grant
	syncRound(svcs)
	all := &pb.CheckItem{Name: "api", Key: key, Limit: 900, DurationMs: 3_600_000, Hits: hits(899), Behavior: pb.Behavior_GLOBAL}
	if r := check(t, svcs[1], all); r.Status != pb.Status_OVER_LIMIT {
		t.Fatalf("owner admitted all 899 hits left while node 0 holds a grant: %v", r)
	}
	c.ring = smaller
	check(t, svcs[1], item) // keep the lease busy so it is broadcast, not forgotten
	syncRound(svcs)
	all.Hits = hits(898)
	if r := check(t, svcs[1], all); r.Status != pb.Status_UNDER_LIMIT {
		t.Errorf("owner refuses the 898 hits left after node 0 left: %v; its grant is still reserved", r)
	}
}

// TestGlobalRetriedToThisNodeKeepsLeases: a GLOBAL check forwarded to an
// owner that fails while the ring makes this node the owner is decided as
// an owned GLOBAL check, against what is not lent out; deciding it as a
// plain check would over-admit.
func TestGlobalRetriedToThisNodeKeepsLeases(t *testing.T) {
	c, svcs := newFakeCluster(3)
	full := c.ring
	without2 := ring.New(full.Members()[:2]...)
	var key string
	for k := 0; ; k++ {
		key = fmt.Sprint("key-", k)
		a, _ := full.Owner(key)
		b, _ := without2.Owner(key)
		if a.Name == "node-2" && b.Name == "node-0" {
			break
		}
	}
	item := &pb.CheckItem{Name: "api", Key: key, Limit: 10, DurationMs: 3_600_000, Behavior: pb.Behavior_GLOBAL}
	c.ring = without2
	check(t, svcs[1], item) // forwarded to node 0, the owner: 1 hit; node 1 asks for a grant
	syncRound(svcs)         // node 0 lends node 1 half of the 9 left: 4
	c.ring = full           // node 0 now sends the key to node 2, which is down ...
	c.down["peer-2"] = true
	c.onDown = func(string) { c.ring = without2 } // ... and the ring moves it back to node 0 meanwhile
	big := &pb.CheckItem{Name: "api", Key: key, Limit: 10, DurationMs: 3_600_000, Hits: hits(6), Behavior: pb.Behavior_GLOBAL}
	if r := check(t, svcs[0], big); r.Status != pb.Status_OVER_LIMIT {
		t.Fatalf("node 0 admitted 6 hits with 9 left and 4 lent to node 1: %v", r)
	}
	admitted := 1
	for range 10 {
		if check(t, svcs[1], item).Status == pb.Status_UNDER_LIMIT {
			admitted++
		}
	}
	if admitted > 10 {
		t.Errorf("admitted %d hits on a limit of 10", admitted)
	}
}

// TestForwardedChecksAreCountedOnce: summed over a cluster, the checks
// metric counts each check once, where it was decided; the forwarding node
// counts it as forwarded.
func TestForwardedChecksAreCountedOnce(t *testing.T) {
	regs := make([]*prometheus.Registry, 3)
	c, svcs := newFakeClusterWith(3, func(i int) Config {
		regs[i] = prometheus.NewRegistry()
		return Config{Registerer: regs[i]}
	})
	item := &pb.CheckItem{Name: "api", Key: c.keyOwnedBy(2), Limit: 10, DurationMs: 60_000}
	for i := range 30 {
		check(t, svcs[i%3], item)
	}
	var decided, forwarded float64
	for _, reg := range regs {
		decided += metricSum(t, reg, "ringlimit_checks_total")
		forwarded += metricSum(t, reg, "ringlimit_forwarded_checks_total")
	}
	if decided != 30 || forwarded != 20 {
		t.Errorf("30 checks, 20 of them at non-owners: counted %v decided and %v forwarded, want 30 and 20", decided, forwarded)
	}
}

// metricSum is the sum of the series of the counter name in reg whose
// labels have the given name, value pairs.
func metricSum(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
					return l.GetName() == labels[i] && l.GetValue() == labels[i+1]
				}) {
					continue series
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

func TestGoneClientIsChargedNothing(t *testing.T) {
	c, svcs := newFakeCluster(3)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	item := &pb.CheckItem{Name: "api", Key: c.keyOwnedBy(2), Limit: 10, DurationMs: 60_000}
	resp, err := svcs[0].Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Responses[0]; r.ErrorCode != pb.ErrorCode_UNAVAILABLE {
		t.Errorf("result for a cancelled request: %v, want UNAVAILABLE", r)
	}
	if n := svcs[0].store.Len(); n != 0 {
		t.Errorf("node 0 holds %d counters: it charged a fallback for a client that had gone", n)
	}
}

// TestForwardRetriesTheNewOwner: when the owner fails while the ring moves
// the key to another node, the check goes to the new owner (once), rather
// than falling back to a share of the limit.
func TestForwardRetriesTheNewOwner(t *testing.T) {
	c, svcs := newFakeCluster(3)
	without2 := ring.New(c.ring.Members()[:2]...)
	var key string
	for k := 0; ; k++ {
		key = fmt.Sprint("key-", k)
		before, _ := c.ring.Owner(key)
		after, _ := without2.Owner(key)
		if before.Name == "node-2" && after.Name == "node-1" {
			break
		}
	}
	c.down["peer-2"] = true
	c.onDown = func(string) { c.ring = without2 }
	item := &pb.CheckItem{Name: "api", Key: key, Limit: 10, DurationMs: 60_000}
	r := check(t, svcs[0], item)
	if r.Status != pb.Status_UNDER_LIMIT || r.Metadata[MetadataDecidedBy] != "" {
		t.Errorf("result %v, want admitted by the new owner, not a fallback", r)
	}
	if svcs[1].store.Len() != 1 || svcs[0].store.Len() != 0 {
		t.Errorf("counters: node 0 %d, node 1 %d; want the new owner, node 1, to hold it", svcs[0].store.Len(), svcs[1].store.Len())
	}
}

// TestForwardRetriesEachKeysNewOwner: a request whose keys node 2 owned,
// forwarded as one group, fails as node 2 leaves the ring, which gives
// one key to node 0 (the sender) and the other to node 1: each is tried
// at its own new owner, not both at the first key's, which would decide
// the second on a counter its owner does not know of.
func TestForwardRetriesEachKeysNewOwner(t *testing.T) {
	c, svcs := newFakeCluster(3)
	without2 := ring.New(c.ring.Members()[:2]...)
	keyTo := func(after string) string {
		for k := 0; ; k++ {
			key := fmt.Sprint("key-", k)
			o, _ := c.ring.Owner(key)
			n, _ := without2.Owner(key)
			if o.Name == "node-2" && n.Name == after {
				return key
			}
		}
	}
	to0, to1 := keyTo("node-0"), keyTo("node-1")
	c.down["peer-2"] = true
	c.onDown = func(string) { c.ring = without2 }
	req := &pb.CheckRequest{Requests: []*pb.CheckItem{
		{Name: "api", Key: to0, Limit: 10, DurationMs: 60_000},
		{Name: "api", Key: to1, Limit: 10, DurationMs: 60_000},
	}}
	resp, err := svcs[0].Check(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	for k, r := range resp.Responses {
		if r.Status != pb.Status_UNDER_LIMIT || r.Remaining != 9 || r.Metadata[MetadataDecidedBy] != "" {
			t.Errorf("check %d: %v, want admitted by its new owner, not a fallback", k, r)
		}
	}
	if svcs[0].store.Len() != 1 || svcs[1].store.Len() != 1 {
		t.Errorf("counters: node 0 %d, node 1 %d; want one each, with each key's new owner", svcs[0].store.Len(), svcs[1].store.Len())
	}
}

// TestGlobalHitsAreFlushedOnShutdown: hits a node admitted from its grant
// reach the owner at shutdown (Run ends, then FlushGlobal), even between
// sync rounds.
func TestGlobalHitsAreFlushedOnShutdown(t *testing.T) {
	c, svcs := newFakeCluster(2)
	item := &pb.CheckItem{Name: "api", Key: c.keyOwnedBy(1), Limit: 1000, DurationMs: 3_600_000, Behavior: pb.Behavior_GLOBAL}
	check(t, svcs[0], item) // forwarded: the owner charges it
	syncRound(svcs)         // node 0 gets a grant
	for range 20 {
		check(t, svcs[0], item) // from the grant: not reported yet
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- svcs[0].Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	svcs[0].FlushGlobal(context.Background())
	peek := &pb.CheckItem{Name: "api", Key: item.Key, Limit: 1000, DurationMs: 3_600_000, Hits: new(int64)}
	if r := check(t, svcs[1], peek); r.Remaining != 1000-21 {
		t.Errorf("owner's counter has %d remaining after node 0 shut down, want %d: hits were lost", r.Remaining, 1000-21)
	}
}
