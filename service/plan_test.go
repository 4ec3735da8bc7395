package service

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/ring"
)

// The tables' cluster: this node is a; c is the member that fails or
// leaves.
var (
	nodeA = ring.Member{Name: "a", PeerAddr: "peer-a"}
	nodeB = ring.Member{Name: "b", PeerAddr: "peer-b"}
	nodeC = ring.Member{Name: "c", PeerAddr: "peer-c"}
)

// planRings are the rings the tables route by: all three members, and the
// ring without c, which is also where c's keys go should it fail.
type planRings struct {
	all, withoutC *ring.Ring
	// Keys by owner in all, and in withoutC for c's.
	ofA, ofB, ofCToA, ofCToB string
}

func newPlanRings() planRings {
	pr := planRings{all: ring.New(nodeA, nodeB, nodeC), withoutC: ring.New(nodeA, nodeB)}
	key := func(owner, then string) string {
		for k := 0; ; k++ {
			key := fmt.Sprint("key-", k)
			o, _ := pr.all.Owner(key)
			h, _ := pr.withoutC.Owner(key)
			if o.Name == owner && (then == "" || h.Name == then) {
				return key
			}
		}
	}
	pr.ofA, pr.ofB, pr.ofCToA, pr.ofCToB = key("a", ""), key("b", ""), key("c", "a"), key("c", "b")
	return pr
}

// planCall is a request of items, routed by r.
func planCall(r *ring.Ring, all bool, items ...*pb.CheckItem) *call {
	c := &call{ring: r, items: items, all: all}
	for i, it := range items {
		c.reqs = append(c.reqs, limiter.Request{Name: it.Name, Key: it.Key})
		c.pos = append(c.pos, i)
	}
	return c
}

func planItem(key string, b pb.Behavior) *pb.CheckItem {
	return &pb.CheckItem{Name: "api", Key: key, Behavior: b}
}

// fakeHandOff is the keys whose counters are still with their previous
// owner, which this node waits for.
type fakeHandOff map[string]ring.Member

func (f fakeHandOff) Pending(_ *ring.Ring, key string) (ring.Member, bool) {
	m, ok := f[key]
	return m, ok
}

// fakeStore is the keys whose counters this node holds.
type fakeStore map[string]bool

func (f fakeStore) Holds(r *limiter.Request) bool { return f[r.Key] }

// planView is this node's view: routing by r, waiting for nothing,
// holding nothing.
func planView(r *ring.Ring) *view {
	return &view{self: nodeA, ring: r, handOff: fakeHandOff{}, store: fakeStore{}, heirs: &ring.Heirs{}}
}

// TestPlanRoutes: each check gets its route from what it does next, its
// behaviour and owner, and what this node sees: one case for every route.
func TestPlanRoutes(t *testing.T) {
	pr := newPlanRings()
	granted := answer{d: algorithms.Decision{Allowed: true}, decided: true}
	cases := []struct {
		name     string
		item     *pb.CheckItem
		all      bool
		p        pending // j is 0
		leaving  bool
		previous fakeHandOff
		held     fakeStore
		global   answer
		want     route
	}{
		{name: "owned here: the store", item: planItem(pr.ofA, pb.Behavior_BATCHED), p: pending{to: nodeA},
			want: route{kind: routeLocal}},
		{name: "no member in the ring: here", item: planItem(pr.ofA, pb.Behavior_BATCHED),
			want: route{kind: routeLocal}},
		{name: "owned elsewhere: forwarded to the owner", item: planItem(pr.ofB, pb.Behavior_BATCHED), p: pending{to: nodeB},
			want: route{kind: routeForward, to: &nodeB}},
		{name: "UNBATCHED owned elsewhere: forwarded too", item: planItem(pr.ofB, pb.Behavior_UNBATCHED), p: pending{to: nodeB},
			want: route{kind: routeForward, to: &nodeB}},
		{name: "LOCAL owned elsewhere: the store", item: planItem(pr.ofB, pb.Behavior_LOCAL), p: pending{to: nodeB},
			want: route{kind: routeLocal}},
		{name: "GLOBAL answered by global", item: planItem(pr.ofB, pb.Behavior_GLOBAL), p: pending{to: nodeB}, global: granted,
			want: route{kind: routeGlobal}},
		{name: "GLOBAL that global sends to its owner", item: planItem(pr.ofB, pb.Behavior_GLOBAL), p: pending{to: nodeB},
			want: route{kind: routeForward, to: &nodeB}},
		{name: "counter still with the previous owner: pulled", item: planItem(pr.ofA, pb.Behavior_BATCHED), p: pending{to: nodeA},
			previous: fakeHandOff{pr.ofA: nodeC},
			want:     route{kind: routePull, to: &nodeC}},
		{name: "a counter here, the word not: pulled all the same", item: planItem(pr.ofA, pb.Behavior_BATCHED), p: pending{to: nodeA},
			previous: fakeHandOff{pr.ofA: nodeC}, held: fakeStore{pr.ofA: true},
			want: route{kind: routePull, to: &nodeC}},
		{name: "all-or-nothing is never pulled", item: planItem(pr.ofA, pb.Behavior_BATCHED), all: true, p: pending{to: nodeA},
			previous: fakeHandOff{pr.ofA: nodeC},
			want:     route{kind: routeLocal}},
		{name: "forwarded here: the store, looked at again by settle", item: planItem(pr.ofA, pb.Behavior_BATCHED),
			p:    pending{to: nodeA, recheck: true},
			want: route{kind: routeLocal, recheck: true}},
		{name: "leaving: kept here for settle", item: planItem(pr.ofB, pb.Behavior_BATCHED), p: pending{to: nodeB}, leaving: true,
			want: route{kind: routeLocal, recheck: true}},
		{name: "leaving: GLOBAL goes as ever", item: planItem(pr.ofB, pb.Behavior_GLOBAL), p: pending{to: nodeB}, leaving: true,
			want: route{kind: routeForward, to: &nodeB}},
		{name: "landed: the store as the owner, never pulled", item: planItem(pr.ofA, pb.Behavior_BATCHED),
			p: pending{to: nodeA, next: nextHere}, previous: fakeHandOff{pr.ofA: nodeC},
			want: route{kind: routeLocal, landed: true}},
		{name: "landed GLOBAL: global as the owner", item: planItem(pr.ofA, pb.Behavior_GLOBAL), p: pending{next: nextHere}, global: granted,
			want: route{kind: routeGlobal, landed: true}},
		{name: "retried at the new owner", item: planItem(pr.ofCToB, pb.Behavior_BATCHED), p: pending{next: nextForward, to: nodeB, retried: true},
			want: route{kind: routeForward, to: &nodeB}},
		{name: "relayed to the heir", item: planItem(pr.ofCToB, pb.Behavior_BATCHED), p: pending{next: nextRelay, to: nodeB, failover: true},
			want: route{kind: routeRelay, to: &nodeB}},
		{name: "pulled again", item: planItem(pr.ofA, pb.Behavior_BATCHED), p: pending{next: nextPull, to: nodeB, retried: true},
			want: route{kind: routePull, to: &nodeB}},
		{name: "this node's share", item: planItem(pr.ofCToB, pb.Behavior_BATCHED), p: pending{next: nextShare},
			want: route{kind: routeFallback}},
		{name: "client gone", item: planItem(pr.ofB, pb.Behavior_BATCHED), p: pending{next: nextGone},
			want: route{kind: routeGone}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := planCall(pr.all, tc.all, tc.item)
			v := planView(pr.all)
			v.leaving = tc.leaving
			if tc.previous != nil {
				v.handOff = tc.previous
			}
			if tc.held != nil {
				v.store = tc.held
			}
			if tc.item.Behavior == pb.Behavior_GLOBAL {
				v.global = []answer{tc.global}
			}
			if got := plan(c, []pending{tc.p}, v); !reflect.DeepEqual(got, []route{tc.want}) {
				t.Errorf("plan = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestReplan: a failed send's checks go on as what the failure taught
// says, in replan's order; one case for every failure that re-plans.
func TestReplan(t *testing.T) {
	pr := newPlanRings()
	unreachable := fmt.Errorf("forward: %w", peer.ErrUnreachable)
	type want struct {
		next     next
		to       ring.Member
		retried  bool
		failover bool
	}
	cases := []struct {
		name   string
		keys   []string
		f      failure
		ring   *ring.Ring // the ring this node routes by now; pr.all if nil
		gone   error
		lesson lesson
		want   []want
	}{
		{name: "pull refused: decided here as the owner", keys: []string{pr.ofA},
			f: failure{kind: routePull, to: nodeC, err: peer.ErrNotHere}, lesson: lessonHere,
			want: []want{{next: nextHere, to: nodeA}}},
		{name: "pull unanswered: decided here as the owner", keys: []string{pr.ofA},
			f: failure{kind: routePull, to: nodeC, err: unreachable}, lesson: lessonHere,
			want: []want{{next: nextHere, to: nodeA}}},
		{name: "forward failed as the ring moved: each key's new owner, here for this node's", keys: []string{pr.ofCToA, pr.ofCToB},
			f: failure{kind: routeForward, to: nodeC, err: unreachable}, ring: pr.withoutC, lesson: lessonMoved,
			want: []want{{next: nextHere, to: nodeA, retried: true}, {next: nextForward, to: nodeB, retried: true}}},
		{name: "one key moved: the group is tried again at each key's owner", keys: []string{pr.ofB, pr.ofCToA},
			f: failure{kind: routeForward, to: nodeB, err: unreachable}, ring: pr.withoutC, lesson: lessonMoved,
			want: []want{{next: nextForward, to: nodeB, retried: true}, {next: nextHere, to: nodeA, retried: true}}},
		{name: "relay failed as the ring moved: relayed to the new owner", keys: []string{pr.ofCToB},
			f: failure{kind: routeRelay, to: nodeC, err: unreachable}, ring: pr.withoutC, lesson: lessonMoved,
			want: []want{{next: nextRelay, to: nodeB, retried: true}}},
		{name: "pull failed as the client left and the ring moved: pulled at the new owner", keys: []string{pr.ofCToB},
			f: failure{kind: routePull, to: nodeC, err: context.DeadlineExceeded}, ring: pr.withoutC, gone: context.DeadlineExceeded,
			lesson: lessonMoved, want: []want{{next: nextPull, to: nodeB, retried: true}}},
		{name: "owner unreachable, ring unmoved: each key's heir, here or relayed", keys: []string{pr.ofCToA, pr.ofCToB},
			f: failure{kind: routeForward, to: nodeC, err: unreachable}, lesson: lessonFailover,
			want: []want{{next: nextHere, to: nodeA, failover: true}, {next: nextRelay, to: nodeB, failover: true}}},
		{name: "a retry that fails is not retried again: the heir", keys: []string{pr.ofCToB},
			f: failure{kind: routeForward, to: nodeC, retried: true, err: unreachable}, ring: pr.all, lesson: lessonFailover,
			want: []want{{next: nextRelay, to: nodeB, failover: true}}},
		{name: "a wrong answer is no sign the ring moved: the heir", keys: []string{pr.ofCToB},
			f: failure{kind: routeForward, to: nodeC, answered: true, err: errors.New("wrong number")}, ring: pr.withoutC, lesson: lessonFailover,
			want: []want{{next: nextRelay, to: nodeB, failover: true}}},
		{name: "client gone: nothing charged", keys: []string{pr.ofCToB},
			f: failure{kind: routeForward, to: nodeC, err: context.Canceled}, ring: pr.withoutC, gone: context.Canceled, lesson: lessonGone,
			want: []want{{next: nextGone}}},
		{name: "client gone, forward timed out, ring unmoved: nothing charged", keys: []string{pr.ofCToB},
			f: failure{kind: routeForward, to: nodeC, err: context.DeadlineExceeded}, gone: context.DeadlineExceeded, lesson: lessonGone,
			want: []want{{next: nextGone}}},
		{name: "relay to the heir failed, its owner still in the ring: relayed to the owner once more", keys: []string{pr.ofCToB},
			f: failure{kind: routeRelay, to: nodeB, err: unreachable}, lesson: lessonMoved,
			want: []want{{next: nextRelay, to: nodeC, retried: true}}},
		{name: "relay failed, ring unmoved: this node's share", keys: []string{pr.ofB},
			f: failure{kind: routeRelay, to: nodeB, err: unreachable}, lesson: lessonShare,
			want: []want{{next: nextShare}}},
		{name: "a retried relay failed: this node's share", keys: []string{pr.ofCToB},
			f: failure{kind: routeRelay, to: nodeB, retried: true, err: unreachable}, ring: pr.withoutC, lesson: lessonShare,
			want: []want{{next: nextShare}}},
		{name: "pull answered wrongly: this node's share", keys: []string{pr.ofA},
			f: failure{kind: routePull, to: nodeC, answered: true, err: errors.New("wrong number")}, lesson: lessonShare,
			want: []want{{next: nextShare}}},
		{name: "no other member to fail over to (this node has left): this node's share", keys: []string{pr.ofB},
			f: failure{kind: routeForward, to: nodeB, err: unreachable}, ring: ring.New(nodeB), lesson: lessonShare,
			want: []want{{next: nextShare}}},
		{name: "an empty ring: this node's share", keys: []string{pr.ofA},
			f: failure{kind: routeForward, to: nodeB, err: unreachable}, ring: ring.New(), lesson: lessonShare,
			want: []want{{next: nextShare}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var items []*pb.CheckItem
			for _, k := range tc.keys {
				items = append(items, planItem(k, pb.Behavior_BATCHED))
			}
			c := planCall(pr.all, false, items...)
			v := planView(pr.all)
			if tc.ring != nil {
				v.ring = tc.ring
			}
			v.gone = tc.gone
			ps := make([]pending, len(items))
			sent := make([]*pending, len(items))
			for j := range ps {
				ps[j] = pending{j: j, to: tc.f.to, next: nextOwner, retried: tc.f.retried, failed: &tc.f}
				sent[j] = &ps[j]
			}
			if got := replan(c, sent, &tc.f, v); got != tc.lesson {
				t.Errorf("lesson %d, want %d", got, tc.lesson)
			}
			for j, w := range tc.want {
				p := ps[j]
				got := want{next: p.next}
				if w.next != nextShare && w.next != nextGone { // where it goes, and how, matter only if it goes
					got.to, got.retried, got.failover = p.to, p.retried, p.failover
				}
				if got != w {
					t.Errorf("check %d (%s) goes on as %+v, want %+v", j, tc.keys[j], got, w)
				}
			}
		})
	}
}
