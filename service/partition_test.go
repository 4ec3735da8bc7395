package service

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/heal"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/ring"
)

// sideLink is one node's way to the others in a fakeCluster split into
// sides: a call to a node of another side fails as a forward across a
// network cut does (the deadline passes), one within its side goes through.
// Only the calls a check makes are cut; replication and hand-off are not
// run while the cluster is split.
type sideLink struct {
	*fakeCluster
	from  string
	sides map[string]int // side of each peer address; nil: not split
}

func (l sideLink) cut(addr string) error {
	if l.sides != nil && l.sides[addr] != l.sides[l.from] {
		return fmt.Errorf("%s across the cut: %w: %w", addr, peer.ErrUnreachable, context.DeadlineExceeded)
	}
	return nil
}

func (l sideLink) Start(ctx context.Context, addr string, req *pb.CheckRequest) peer.Forwarding {
	if err := l.cut(addr); err != nil {
		f := &fakeForwarding{done: make(chan struct{}), cancel: func() {}, err: err}
		close(f.done)
		return f
	}
	return l.fakeCluster.Start(ctx, addr, req)
}

func (l sideLink) ForwardNow(ctx context.Context, addr string, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	if err := l.cut(addr); err != nil {
		return nil, err
	}
	return l.fakeCluster.ForwardNow(ctx, addr, req)
}

func (l sideLink) Relay(ctx context.Context, addr string, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	if err := l.cut(addr); err != nil {
		return nil, err
	}
	return l.fakeCluster.Relay(ctx, addr, req)
}

func (l sideLink) Pull(ctx context.Context, addr string, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	if err := l.cut(addr); err != nil {
		return nil, err
	}
	return l.fakeCluster.Pull(ctx, addr, req)
}

// split cuts the fake cluster into sides, given as lists of node indexes:
// each node reaches only the nodes of its side.
func split(svcs []*Service, c *fakeCluster, sides ...[]int) {
	at := map[string]int{}
	for side, nodes := range sides {
		for _, i := range nodes {
			at[fmt.Sprint("peer-", i)] = side
		}
	}
	for i, s := range svcs {
		s.peers = sideLink{fakeCluster: c, from: fmt.Sprint("peer-", i), sides: at}
	}
}

// sideRings makes each node of each side see the ring of its side alone,
// as memberlist leaves each side once it has declared the other dead.
func sideRings(c *fakeCluster, sides ...[]int) {
	for _, nodes := range sides {
		var ms []ring.Member
		for _, i := range nodes {
			m, _ := c.ring.Member(fmt.Sprint("node-", i))
			ms = append(ms, m)
		}
		r := ring.New(ms...)
		for _, m := range ms {
			c.views.Store(m.Name, r)
		}
	}
}

// TestPartitionAdmitsAtMostTheLimitPerSide: a cluster of five split 3/2,
// first with every ring whole (the sides have not declared each other dead
// yet: the owner is unreachable, its keys fail over), then with each side
// routing by its own ring, admits for each key at most the limit on the
// owner's side and the limit once more on the other: each side decides a
// key whose owner it cannot reach on one counter, with the whole limit.
// Before, each node of the side without the owner admitted a share of the
// limit on a counter of its own, and then the side's new owner the limit
// again: up to 2.4 limits for a key whose owner and heir were across.
func TestPartitionAdmitsAtMostTheLimitPerSide(t *testing.T) {
	for _, alg := range []pb.Algorithm{pb.Algorithm_SLIDING_WINDOW, pb.Algorithm_FIXED_WINDOW, pb.Algorithm_SLIDING_LOG, pb.Algorithm_TOKEN_BUCKET} {
		t.Run(alg.String(), func(t *testing.T) { testPartitionBound(t, alg) })
	}
}

func testPartitionBound(t *testing.T, alg pb.Algorithm) {
	c, svcs := newFakeCluster(5)
	const keys, limit = 60, 10
	items := make([]*pb.CheckItem, keys)
	admitted := make([]int, keys)
	send := func(nodes []int, rounds int) {
		for range rounds {
			for k, item := range items {
				for _, i := range nodes {
					if check(t, svcs[i], item).Status == pb.Status_UNDER_LIMIT {
						admitted[k]++
					}
				}
			}
		}
	}
	for k := range items {
		items[k] = &pb.CheckItem{Name: "api", Key: fmt.Sprint("key-", k), Limit: limit, DurationMs: 3_600_000, Algorithm: alg}
	}
	all := []int{0, 1, 2, 3, 4}
	send(all[:1], 3) // 3 hits a key before the split, replicated to each heir
	for _, s := range svcs {
		s.custody.Replicate(t.Context())
	}
	sides := [][]int{{0, 1, 2}, {3, 4}}
	split(svcs, c, sides...)
	send(all, 2) // the rings still whole: failover
	sideRings(c, sides...)
	send(all, 4) // each side on its own ring
	for k, n := range admitted {
		if n > 2*limit {
			t.Errorf("%s: admitted %d over the split, want at most %d: the limit on each side", items[k].Key, n, 2*limit)
		}
	}
}

// TestFailOverSkipsSuspects: a check whose owner cannot be reached goes
// to the first member of its key's succession this node does not suspect
// (here for this node), and a relay to a member it failed over to that
// goes unanswered goes on to the next; a node that suspects every other
// member and is not the key's heir decides with its share, as does a
// check that has failed over maxHops times.
func TestFailOverSkipsSuspects(t *testing.T) {
	pr := newPlanRings()
	unreachable := fmt.Errorf("forward: %w", peer.ErrUnreachable)
	four := ring.New(nodeA, nodeB, nodeC, ring.Member{Name: "d", PeerAddr: "peer-d"})
	var keyCBA string // a key of c in four, then of b without c, then of a without b and c
	for k := 0; keyCBA == ""; k++ {
		key := fmt.Sprint("key-", k)
		o, _ := four.Owner(key)
		h, _ := four.Without("c").Owner(key)
		n, _ := four.Without("c").Without("b").Owner(key)
		if o.Name == "c" && h.Name == "b" && n.Name == "a" {
			keyCBA = key
		}
	}
	cases := []struct {
		name     string
		ring     *ring.Ring
		key      string
		f        failure
		failover bool
		hops     uint8
		suspect  []string
		lesson   lesson
		next     next
		to       ring.Member
	}{
		{name: "owner and heir suspect: the next member, here", ring: four, key: keyCBA,
			f: failure{kind: routeForward, to: nodeC, err: unreachable}, suspect: []string{"peer-b", "peer-c"},
			lesson: lessonFailover, next: nextHere, to: nodeA},
		{name: "relay to the heir unanswered: the next member", ring: four, key: keyCBA, failover: true, hops: 1,
			f: failure{kind: routeRelay, to: nodeB, err: unreachable}, suspect: []string{"peer-c"},
			lesson: lessonFailover, next: nextHere, to: nodeA},
		{name: "every other member suspect, not the heir: the share", ring: pr.all, key: pr.ofCToB,
			f: failure{kind: routeForward, to: nodeC, err: unreachable}, suspect: []string{"peer-b", "peer-c"},
			lesson: lessonShare, next: nextShare},
		{name: "every other member suspect, the heir: decided here", ring: pr.all, key: pr.ofCToA,
			f: failure{kind: routeForward, to: nodeC, err: unreachable}, suspect: []string{"peer-b", "peer-c"},
			lesson: lessonFailover, next: nextHere, to: nodeA},
		{name: "maxHops failovers: the share", ring: four, key: keyCBA, failover: true, hops: maxHops,
			f:      failure{kind: routeRelay, to: nodeB, err: unreachable},
			lesson: lessonShare, next: nextShare},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := planCall(tc.ring, false, planItem(tc.key, pb.Behavior_BATCHED))
			v := planView(tc.ring)
			v.suspect = func(addr string) bool { return slices.Contains(tc.suspect, addr) }
			p := pending{j: 0, to: tc.f.to, failover: tc.failover, hops: tc.hops, failed: &tc.f}
			if tc.failover {
				p.skip = "c"
			}
			if got := replan(c, []*pending{&p}, &tc.f, v); got != tc.lesson {
				t.Errorf("lesson %d, want %d", got, tc.lesson)
			}
			if p.next != tc.next || (tc.next != nextShare && p.to != tc.to) {
				t.Errorf("goes on as next %d to %v, want next %d to %v", p.next, p.to, tc.next, tc.to)
			}
		})
	}
}

// TestHeirGivesBackWhatItDecidedOnceTheOwnerAnswers: the heir that
// decided an unreachable owner's key by failover gives the counter back
// to the owner once the owner answers again, without a ring change: the
// owner's counter then counts what both sides admitted during the split
// (the heir's hits added to the owner's counter, not the more charged of
// the two), and the heir holds nothing for the key. Before, the counter
// stayed with the heir until the next ring change, and the owner went on
// from its own; then the owner kept the more charged of the two.
func TestHeirGivesBackWhatItDecidedOnceTheOwnerAnswers(t *testing.T) {
	c, svcs := newFakeCluster(3)
	key := c.keyInheritedBy(2, 1)
	item := &pb.CheckItem{Name: "api", Key: key, Limit: 10, DurationMs: 3_600_000, Algorithm: pb.Algorithm_SLIDING_WINDOW}
	for range 4 {
		check(t, svcs[0], item)
	}
	svcs[2].custody.Replicate(t.Context())
	c.down["peer-2"] = true
	for range 3 {
		if r := check(t, svcs[0], item); r.Metadata[MetadataDecidedBy] != routeFailover {
			t.Logf("%v", r)
			t.Fatalf("with the owner down: %v, want decided by failover", r)
		}
	}
	for range 2 { // the owner's side of the split admits too
		if r := check(t, svcs[2], item); r.Status != pb.Status_UNDER_LIMIT || r.Metadata[MetadataDecidedBy] == routeFailover {
			t.Fatalf("at the owner during the split: %v, want admitted by the owner", r)
		}
	}
	c.down["peer-2"] = false
	heir := svcs[1]
	heir.heal.GiveBack(t.Context())
	if !heir.store.Holds(&limiter.Request{Name: "api", Key: key, Algorithm: limiter.SlidingWindow}) {
		t.Fatal("the heir gave the counter back within heal.StandInQuiet of its last failover decision")
	}
	heir.heal.StandIn("peer-2", time.Now().Add(-heal.StandInQuiet)) // quiet since
	heir.heal.GiveBack(t.Context())
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); heir.custody.Run(ctx) }() // the round giveBack asked for
	defer func() { cancel(); <-done }()
	probe := &pb.CheckItem{Name: "api", Key: key, Limit: 10, DurationMs: 3_600_000, Algorithm: pb.Algorithm_SLIDING_WINDOW, Hits: proto.Int64(0)}
	left := check(t, svcs[2], probe).Remaining
	for end := time.Now().Add(10 * time.Second); left != 1 && time.Now().Before(end); left = check(t, svcs[2], probe).Remaining {
		time.Sleep(time.Millisecond)
	}
	if left != 1 {
		t.Errorf("the owner has %d left after the heal, want 1: 4 before the split, then its heir's 3 and its own 2", left)
	}
	if heir.store.Len() != 0 {
		t.Errorf("the heir still holds %d counters", heir.store.Len())
	}
}
