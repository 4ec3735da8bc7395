package service

import (
	"context"
	"fmt"
	"testing"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/ring"
)

// fakeCluster is several services in one process, joined by direct calls
// instead of gRPC, so that protocol tests are deterministic. Real gRPC and
// memberlist are exercised by the tests in cmd/rlnode and e2e.
type fakeCluster struct {
	ring  *ring.Ring
	nodes map[string]*Service // by peer address
	down  map[string]bool     // peer addresses that do not answer
	// onDown, if set, is called when a call reaches a down peer, before it
	// fails: a test can change the ring as the call is in flight.
	onDown func(addr string)
	// onHandOff, if set, sees (and may alter) every hand-off in flight.
	onHandOff func(counters []*pb.CounterState)
}

type fakeMember struct {
	c    *fakeCluster
	self ring.Member
}

func (m fakeMember) Ring() *ring.Ring         { return m.c.ring }
func (m fakeMember) LocalMember() ring.Member { return m.self }

func (c *fakeCluster) peer(ctx context.Context, addr string) (Owner, error) {
	if err := ctx.Err(); err != nil {
		return Owner{}, err
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

func (c *fakeCluster) ForwardNow(ctx context.Context, addr string, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	return c.Forward(ctx, addr, req)
}

func (c *fakeCluster) AddGlobalHits(ctx context.Context, addr, from string, reports []*pb.GlobalReport) error {
	o, err := c.peer(ctx, addr)
	if err == nil {
		o.AddGlobalHits(ctx, from, reports)
	}
	return err
}

func (c *fakeCluster) UpdateGlobals(ctx context.Context, addr string, states []*pb.GlobalState) error {
	o, err := c.peer(ctx, addr)
	if err == nil {
		o.UpdateGlobals(ctx, states)
	}
	return err
}

func (c *fakeCluster) HandOff(ctx context.Context, addr, from string, counters []*pb.CounterState) ([]*pb.Refusal, error) {
	o, err := c.peer(ctx, addr)
	if err != nil {
		return nil, err
	}
	if c.onHandOff != nil {
		c.onHandOff(counters)
	}
	return o.HandOff(ctx, from, counters), nil
}

// newFakeCluster returns n services named node-0.. on a fixed clock.
func newFakeCluster(n int) (*fakeCluster, []*Service) {
	c := &fakeCluster{nodes: map[string]*Service{}, down: map[string]bool{}}
	var members []ring.Member
	for i := range n {
		members = append(members, ring.Member{Name: fmt.Sprint("node-", i), PeerAddr: fmt.Sprint("peer-", i)})
	}
	c.ring = ring.New(members...)
	var svcs []*Service
	for _, m := range members {
		s := New(Config{Cluster: fakeMember{c, m}, Peers: c, Now: fixedClock(t0)})
		c.nodes[m.PeerAddr] = s
		svcs = append(svcs, s)
	}
	return c, svcs
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

// syncRound runs one GLOBAL round on every node: reports, then broadcasts.
func syncRound(svcs []*Service) {
	for _, s := range svcs {
		s.globals.report(context.Background())
	}
	for _, s := range svcs {
		s.globals.broadcast(context.Background())
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

func TestUnreachableOwnerFallsBackToShare(t *testing.T) {
	c, svcs := newFakeCluster(3)
	c.down["peer-2"] = true
	item := &pb.CheckItem{Name: "api", Key: c.keyOwnedBy(2), Limit: 30, DurationMs: 60_000}
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

func TestGlobalGrantsAnswerLocally(t *testing.T) {
	c, svcs := newFakeCluster(2)
	item := &pb.CheckItem{Name: "api", Key: c.keyOwnedBy(1), Limit: 1000, DurationMs: 3_600_000, Behavior: pb.Behavior_GLOBAL}
	check(t, svcs[0], item) // no grant yet: forwarded, and asks for one
	syncRound(svcs)
	for range 50 {
		if r := check(t, svcs[0], item); r.Status != pb.Status_UNDER_LIMIT {
			t.Fatalf("refused with a grant: %v", r)
		}
	}
	e := svcs[0].globals.entries[globalKey{"api", item.Key}]
	if e == nil || e.admitted != 50 || e.granted < 50 {
		t.Fatalf("node 0's entry after 50 local checks: %+v", e)
	}
	// A round reports the hits to the owner.
	syncRound(svcs)
	peek := &pb.CheckItem{Name: "api", Key: item.Key, Limit: 1000, DurationMs: 3_600_000, Hits: new(int64)}
	if r := check(t, svcs[1], peek); r.Remaining > 1000-51 {
		t.Errorf("owner reports %d remaining after 51 hits elsewhere", r.Remaining)
	}
	// Idle for a round: node 0 gives its grant back.
	syncRound(svcs)
	syncRound(svcs)
	if l := svcs[1].globals.leases[globalKey{"api", item.Key}]; l != nil && l.outstanding() != 0 {
		t.Errorf("owner still lends %d hits to an idle node", l.outstanding())
	}
}

// TestGlobalGrantsOfDepartedNodesAreFreed: a node that leaves the cluster
// (or dies) with a grant must not keep the owner from lending those hits
// to others.
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
	lease := func() *lease { return svcs[1].globals.leases[globalKey{"api", key}] }
	if l := lease(); l == nil || l.outstanding() == 0 {
		t.Fatalf("node 0 holds no grant after a round: %+v", l)
	}
	c.ring = smaller
	check(t, svcs[1], item) // keep the lease busy so it is broadcast, not forgotten
	syncRound(svcs)
	if l := lease(); l != nil && l.outstanding() != 0 {
		t.Errorf("the owner still lends %d hits to a node that left", l.outstanding())
	}
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

// TestGlobalHitsAreFlushedOnShutdown: hits a node admitted from its grant
// reach the owner when the node's Run ends, even between sync rounds.
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
	peek := &pb.CheckItem{Name: "api", Key: item.Key, Limit: 1000, DurationMs: 3_600_000, Hits: new(int64)}
	if r := check(t, svcs[1], peek); r.Remaining != 1000-21 {
		t.Errorf("owner's counter has %d remaining after node 0 shut down, want %d: hits were lost", r.Remaining, 1000-21)
	}
}
