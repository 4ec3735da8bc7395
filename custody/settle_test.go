package custody

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/strict"
)

// The tables' cluster: this node is a; c is the member that fails or
// leaves.
var (
	nodeA = ring.Member{Name: "a", PeerAddr: "peer-a"}
	nodeB = ring.Member{Name: "b", PeerAddr: "peer-b"}
	nodeC = ring.Member{Name: "c", PeerAddr: "peer-c"}
)

// fixedMembership is a cluster whose ring is r, seen by self.
type fixedMembership struct {
	r    *ring.Ring
	self ring.Member
}

func (m fixedMembership) Ring() *ring.Ring         { return m.r }
func (m fixedMembership) LocalMember() ring.Member { return m.self }
func (fixedMembership) Ready() bool                { return true }
func (fixedMembership) Returning() []string        { return nil }

// noWatch suspects no one and notes nothing.
type noWatch struct{}

func (noWatch) Suspect(string) bool       { return false }
func (noWatch) StandIn(string, time.Time) {}
func (noWatch) GaveBack() <-chan struct{} { return nil }

// tableCustody is the custody of node a of a cluster whose ring is r,
// holding the counters of the keys in held.
func tableCustody(r *ring.Ring, held map[string]bool) *Custody {
	return New(Config{Store: limiter.New(limiter.Config{}), Cluster: fixedMembership{r, nodeA}, Fence: strict.New(0, 0),
		Watch: noWatch{}, Holds: func(req *limiter.Request) bool { return held[req.Key] }})
}

// TestSettle: of the checks bound for this node's store, those that may
// have moved and whose counter is elsewhere go to their owner now, and
// those whose counter is here are kept, decided only on it; an
// all-or-nothing request's checks go together.
func TestSettle(t *testing.T) {
	all, withoutC := ring.New(nodeA, nodeB, nodeC), ring.New(nodeA, nodeB)
	key := func(owner, then string) string {
		for k := 0; ; k++ {
			key := fmt.Sprint("key-", k)
			o, _ := all.Owner(key)
			h, _ := withoutC.Owner(key)
			if o.Name == owner && (then == "" || h.Name == then) {
				return key
			}
		}
	}
	ofA, ofB, ofCToB := key("a", ""), key("b", ""), key("c", "b")
	cases := []struct {
		name string
		cks  []Check    // their Req.Key set from keys
		keys []string   // the checks' keys
		all  bool       // an all-or-nothing request
		ring *ring.Ring // the ring they were routed by; all if nil
		held map[string]bool
		want []ring.Member // GoTo: its To; stays: the zero Member
		keep []ring.Member // stays, decided only on a counter held here: its To; nil: none
	}{
		{name: "routed by the current ring, not forwarded: stays",
			keys: []string{ofB}, cks: []Check{{}}},
		{name: "forwarded here, the counter elsewhere: goes to the owner",
			keys: []string{ofB}, cks: []Check{{Recheck: true}},
			want: []ring.Member{nodeB}},
		{name: "forwarded here, the counter here: stays, and the hand-off carries it on",
			keys: []string{ofB}, cks: []Check{{Recheck: true}}, held: map[string]bool{ofB: true},
			keep: []ring.Member{nodeB}},
		{name: "routed by an older ring, the counter elsewhere: goes to the owner",
			keys: []string{ofB}, cks: []Check{{}}, ring: withoutC,
			want: []ring.Member{nodeB}},
		{name: "this node's key: stays",
			keys: []string{ofA}, cks: []Check{{Recheck: true}}},
		{name: "landed: decided where it lands",
			keys: []string{ofB}, cks: []Check{{Landed: true}}, ring: withoutC},
		{name: "LOCAL: stays",
			keys: []string{ofB}, cks: []Check{{Recheck: true, Local: true}}},
		{name: "all-or-nothing: a counter elsewhere takes the request's other keys of other nodes along",
			keys: []string{ofB, ofCToB, ofA, ofB},
			cks:  []Check{{Recheck: true}, {Recheck: true}, {Recheck: true}, {Local: true}},
			all:  true, held: map[string]bool{ofCToB: true},
			want: []ring.Member{nodeB, nodeC, {}, {}}},
		{name: "not all-or-nothing: only the counter elsewhere moves",
			keys: []string{ofB, ofCToB}, cks: []Check{{Recheck: true}, {Recheck: true}},
			held: map[string]bool{ofCToB: true},
			want: []ring.Member{nodeB, {}},
			keep: []ring.Member{{}, nodeC}},
		{name: "all-or-nothing, every counter here: stays whole, none kept apart",
			keys: []string{ofB, ofA}, cks: []Check{{Recheck: true}, {Recheck: true}},
			all: true, held: map[string]bool{ofB: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			routed := all
			if tc.ring != nil {
				routed = tc.ring
			}
			c := tableCustody(all, tc.held)
			cks := make([]Check, len(tc.cks))
			for i := range cks {
				cks[i] = tc.cks[i]
				cks[i].Req = &limiter.Request{Name: "api", Key: tc.keys[i]}
			}
			c.settle(routed, tc.all, cks)
			var relay, keep []ring.Member
			for i := range cks {
				switch v := cks[i].Verdict; {
				case v.Kind == GoTo:
					if relay == nil {
						relay = make([]ring.Member, len(cks))
					}
					relay[i] = *v.To
				case v.To != nil:
					if keep == nil {
						keep = make([]ring.Member, len(cks))
					}
					keep[i] = *v.To
					if !cks[i].Req.Held {
						t.Errorf("check %d kept for %s, its request not held: the store could begin its counter afresh", i, v.To.Name)
					}
				}
			}
			if !reflect.DeepEqual(relay, tc.want) || !reflect.DeepEqual(keep, tc.keep) {
				t.Errorf("settle = go to %v, keep %v; want %v, %v", relay, keep, tc.want, tc.keep)
			}
		})
	}
}
