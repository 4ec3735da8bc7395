package service

import (
	"context"
	"errors"
	"slices"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// A request's checks are decided in rounds (Service.decide, check.go).
// Each round takes the node's view at one instant (view), re-plans the
// checks whose send failed in the round before (replan), asks package
// global about the GLOBAL checks it would decide here, and gives each
// check still pending one route (plan); then it carries the routes out,
// the checks decided here first, then every send at once. plan and replan
// are pure, tested by the tables of plan_test.go. What a new route takes:
// docs/design-cluster.md, "The rounds of a check".

// A routeKind is how a check goes in one round: decided on this node (the
// first numDecided, whose names are the route label of ringlimit_checks_total),
// sent to another node, or answered without a decision.
type routeKind uint8

const (
	routeLocal    routeKind = iota // this node's store: it owns the key, or LOCAL behaviour
	routeGlobal                    // GLOBAL: from this node's grant, or as the owner
	routeFallback                  // the owner was unreachable: this node's share of the limit
	routeEscrow                    // strict mode: no owner to decide it, and no escrow left here: refused (strict.go)
	routeForward                   // to the key's owner, which may relay or pull it
	routeRelay                     // to a node that decides it where it lands, never passing it on (see Owner.Forwarded)
	routePull                      // to the key's previous owner, which decides it only if it holds the counter (see Owner.Pulled)
	routeGone                      // not decided: the client has gone, and nothing is charged on its behalf
	numRouteKinds
	// numDecided is the number of kinds that decide on this node.
	numDecided = routeEscrow + 1
)

var routeNames = [numRouteKinds]string{"local", "global", "fallback", "escrow", "forward", "relay", "pull", "gone"}

func (k routeKind) String() string { return routeNames[k] }

// MetadataDecidedBy is the result metadata key that says a check was not
// decided by its owner: "failover" (by the key's heir, on its replica,
// with the whole limit) or routeFallback's name, "fallback" (by this node,
// with its share).
const MetadataDecidedBy = "decided_by"

// routeFailover is the MetadataDecidedBy value of a check decided by its
// key's heir because the owner could not be reached (see replan).
const routeFailover = "failover"

// A route is how one check goes in one round: its kind, and the node it
// goes to. The plan gives one to each pending check.
type route struct {
	kind routeKind
	// to is the node a forward, relay or pull goes to; nil for the
	// others. It points into the pending checks, or at a member the plan
	// found: a route is read in the round it is planned for.
	to *ring.Member
	// landed says a check decided here (routeLocal, routeGlobal) is
	// decided as the key's owner, and was relayed or pulled here, or a
	// re-plan made this node its owner or heir: it is never passed on
	// again, nor pulled, and its replica, if this node holds one, becomes
	// its counter first (replica.Node.PromoteKey).
	landed bool
	// recheck says that a check bound for this node's store may not be
	// this node's to decide by the time it gets there, even if the ring has
	// not changed: it was forwarded here, or this node is leaving (see
	// settle).
	recheck bool
}

// next is what a pending check does next, as its arrival or the last
// re-plan says; plan turns it into a route with the view.
type next uint8

const (
	nextOwner   next = iota // go as a check of its key's owner: decided here if that is this node, forwarded if not
	nextHere                // decided here as the key's owner (see route.landed)
	nextForward             // forwarded again, to the key's new owner
	nextRelay               // relayed to the node that decides it where it lands
	nextPull                // pulled again, from the key's new owner (the client left while the first pull failed)
	nextShare               // decided here with this node's share of the limit
	nextEscrow              // strict mode: refused here, from the escrow this node lacks (strict.go)
	nextGone                // answered unavailable: the client has gone
)

// pending is a check not decided yet, and what the plan knows of it
// between rounds. Only the loop that decides the request (Service.decide)
// reads and writes it.
type pending struct {
	// to is its key's owner as this node routes it, looked up once when
	// the check arrives (the zero Member: a ring with no members, decided
	// here), or the node it goes to next (nextForward, nextRelay,
	// nextPull). Only a re-plan after a failed send changes it: to the
	// key's owner in the ring as it is then, or to its heir.
	to ring.Member
	// failed is what its send taught, when that failed, shared by the
	// checks sent together; nil otherwise.
	failed  *failure
	j       int  // the check: call.reqs[j]
	next    next // what it does next
	recheck bool // forwarded here: settle looks again where its counter is
	retried bool // sent again after its first node failed: not a third time
	// failover says its owner could not be reached: it goes to, or is
	// decided by, its heir (decided_by "failover").
	failover bool
	// skip is the owner whose failure sent it to fail over, and hops the
	// members it has failed over to so far (see failOver).
	skip string
	hops uint8
}

// failure is what a send that failed taught about the checks it carried.
type failure struct {
	kind    routeKind   // routeForward, routeRelay or routePull
	to      ring.Member // the node it went to
	retried bool        // it was a retry
	err     error
	// answered says the node answered, with the wrong number of results:
	// not a sign that the ring moved, nor a refusal of a pull.
	answered bool
}

// answer is GLOBAL's answer for a check: decided (from this node's grant,
// or as the owner), or to be forwarded to the owner.
type answer struct {
	d       algorithms.Decision
	decided bool
}

// handOffs is what the plan reads of hand-off: *handoff.Node.
type handOffs interface {
	Pending(r *ring.Ring, key string) (ring.Member, bool)
}

// holder is what the plan reads of the store: *limiter.Store.
type holder interface {
	Holds(r *limiter.Request) bool
}

// view is everything the plan reads of the node, at one instant.
type view struct {
	self ring.Member
	// ring is the ring this node routes by now (Service.ring): the
	// cluster's, or once it leaves, the cluster's without it.
	ring    *ring.Ring
	leaving bool // this node is leaving (Service.Leave)
	// gone is the client's context's error: not nil once it has gone.
	gone error
	// handOff says which keys' counters are still with their previous
	// owner, and store which counters are here.
	handOff handOffs
	store   holder
	// heirs finds who would inherit a failed owner's keys.
	heirs *ring.Heirs
	// suspect reports whether this node suspects the member at a peer
	// address (see suspects); nil suspects none.
	suspect func(addr string) bool
	// strict says the node is in strict mode (strict.go): a check whose
	// owner cannot be reached is never failed over nor decided with a share.
	strict bool
	// global holds GLOBAL's answers, by position in the pending checks,
	// for the GLOBAL checks to decide here (see Service.askGlobal); nil
	// when there are none.
	global []answer
}

// owns reports whether m, a key's owner, is this node: m is, or the ring
// has no members (the zero Member).
func (v *view) owns(m ring.Member) bool { return m.Name == "" || m.Name == v.self.Name }

// plan returns the route of each pending check of c, from what it does
// next and the view. A check that goes as its owner's check (nextOwner)
// is decided by the part of the node its behaviour and owner call for:
// LOCAL here; GLOBAL by package global, or at the owner when it says so;
// any other here if this node owns the key or is leaving, else at the
// owner. A check whose counter may still be with the key's previous holder
// (handoff.Node.Await, then Pending until that member says it is done) is
// pulled from it, though its counter is here: it may not be the whole of
// it. Checks relayed or pulled here, and those of an all-or-nothing
// request, wait here instead (custody.Custody.Prepare). See
// docs/design-cluster.md, "The rounds of a check".
func plan(c *call, ps []pending, v *view) []route {
	routes := make([]route, len(ps))
	for k := range ps {
		p := &ps[k]
		switch p.next {
		case nextHere:
			routes[k] = route{kind: routeLocal, landed: true}
			if c.behavior(p.j) == pb.Behavior_GLOBAL {
				routes[k].kind = routeGlobal
			}
		case nextForward:
			routes[k] = route{kind: routeForward, to: &p.to}
		case nextRelay:
			routes[k] = route{kind: routeRelay, to: &p.to}
		case nextPull:
			routes[k] = route{kind: routePull, to: &p.to}
		case nextShare:
			routes[k] = route{kind: routeFallback}
		case nextEscrow:
			routes[k] = route{kind: routeEscrow}
		case nextGone:
			routes[k] = route{kind: routeGone}
		default:
			routes[k] = firstRoute(c, p, v, k)
		}
	}
	return routes
}

// firstRoute is the route of p, the kth pending check of c, as its
// owner's check (see plan).
func firstRoute(c *call, p *pending, v *view, k int) route {
	b := c.behavior(p.j)
	owned, recheck := v.owns(p.to), p.recheck
	if v.leaving && b != pb.Behavior_LOCAL && b != pb.Behavior_GLOBAL {
		owned, recheck = true, true // decided here, or relayed by settle
	}
	switch {
	case b == pb.Behavior_LOCAL:
		return route{kind: routeLocal, recheck: recheck}
	case b == pb.Behavior_GLOBAL && v.global[k].decided:
		return route{kind: routeGlobal}
	case b == pb.Behavior_GLOBAL, !owned:
		return route{kind: routeForward, to: &p.to}
	}
	if !c.all {
		r := &c.reqs[p.j]
		if from, ok := v.handOff.Pending(c.ring, r.Key); ok {
			prev := from // on the heap only when pulled
			return route{kind: routePull, to: &prev}
		}
	}
	return route{kind: routeLocal, recheck: recheck}
}

// A lesson is what a failed send taught about its checks: what they do
// next.
type lesson uint8

const (
	lessonHere     lesson = iota // a pull found the counter not there: decided here, as the key's owner
	lessonMoved                  // the ring has moved: each key's new owner decides it (this node those it owns now)
	lessonGone                   // the client has gone: charge nothing
	lessonFailover               // the owner cannot be reached: each key's heir decides it
	lessonShare                  // no one else can: this node decides it with its share
	lessonEscrow                 // strict mode: the owner cannot be reached, and no one else may decide it
)

// replan says what the checks ps, all of the send that failed as f says,
// do next, and returns the lesson. In order: a pull whose node does not
// hold the counter, or does not answer, is decided here; a send the ring
// moved while in flight is tried once more at each key's current owner;
// a client that has gone is charged nothing; a forward whose owner, or a
// relay whose member it failed over to, cannot be reached fails over
// (failOver); anything else falls back to this node's share. In strict
// mode (v.strict) neither of the last two happens: only the owner decides
// a key, so such a check is refused here. See docs/design-cluster.md,
// "The rounds of a check".
func replan(c *call, ps []*pending, f *failure, v *view) lesson {
	switch {
	case f.kind == routePull && !f.answered && v.gone == nil:
		for _, p := range ps {
			p.next, p.to = nextHere, v.self
		}
		return lessonHere
	case f.kind == routeRelay && v.gone == nil && ps[0].failover:
		return failOver(c, ps, f, v)
	case !f.answered && !f.retried && !errors.Is(f.err, context.Canceled) && moved(c, ps, f, v):
		for _, p := range ps {
			p.to, _ = v.ring.Owner(c.reqs[p.j].Key)
			p.retried = true
			switch {
			case v.owns(p.to):
				p.next = nextHere
			case f.kind == routeRelay:
				p.next = nextRelay
			case f.kind == routePull:
				p.next = nextPull
			default:
				p.next = nextForward
			}
		}
		return lessonMoved
	case v.gone != nil:
		for _, p := range ps {
			p.next = nextGone
		}
		return lessonGone
	case v.strict:
		for _, p := range ps {
			p.next = nextEscrow
		}
		return lessonEscrow
	case f.kind == routeForward:
		return failOver(c, ps, f, v)
	}
	for _, p := range ps {
		p.next = nextShare
	}
	return lessonShare
}

// maxHops bounds the members a check fails over to, one after another,
// before it is decided here with this node's share: a cluster split in
// three leaves at most two unreachable members ahead of a reachable one in
// a key's succession, once this node suspects them (see failOver).
const maxHops = 3

// failOver sends each check of ps, whose forward to its owner or relay to
// a member it failed over to went unanswered (f), to the first member of
// its key's succession that this node can reach: the key's owner in the
// ring v routes by without the owner that failed, the member f went to,
// and every member this node suspects. That is the key's heir, which holds
// the owner's replica, while only the owner is unreachable, and the same
// member for every node of one side of a partition, so that a side admits
// at most the limit. A GLOBAL check goes to the heir only; it, and a check
// that has failed over maxHops times or finds no member left, is decided
// here with this node's share. See docs/design-cluster.md, "The rounds of
// a check".
func failOver(c *call, ps []*pending, f *failure, v *view) lesson {
	out := []string{f.to.Name}
	for _, p := range ps {
		if p.skip == "" {
			p.skip = f.to.Name
		}
		if !slices.Contains(out, p.skip) {
			out = append(out, p.skip)
		}
	}
	if v.suspect != nil {
		for _, m := range v.ring.Members() {
			if v.suspect(m.PeerAddr) && !slices.Contains(out, m.Name) {
				out = append(out, m.Name)
			}
		}
	}
	slices.Sort(out)
	rest := v.heirs.WithoutAll(v.ring, out)
	heirs := v.heirs.Without(v.ring, f.to.Name)
	lesson := lessonShare
	alone := rest.Len() == 1 // but for this node, every member is out of reach
	for _, p := range ps {
		key := c.reqs[p.j].Key
		to, ok := rest.Owner(key)
		if c.behavior(p.j) == pb.Behavior_GLOBAL {
			to, ok = heirs.Owner(key)
			ok = ok && f.kind == routeForward
		} else if heir, _ := heirs.Owner(key); alone && heir.Name != v.self.Name {
			ok = false // a side of one: its share, on the counter it will own once its ring drops the others
		}
		if !ok || p.hops >= maxHops {
			p.next = nextShare
			continue
		}
		p.to, p.hops = to, p.hops+1
		p.failover, p.retried = true, false // a relay of its own: tried again at a new owner if the ring moves
		p.next = nextRelay
		if p.to.Name == v.self.Name {
			p.next = nextHere
		}
		lesson = lessonFailover
	}
	return lesson
}

// moved reports whether the ring v routes by gives the key of any of ps,
// sent together to f.to, an owner other than f.to, and every key one.
func moved(c *call, ps []*pending, f *failure, v *view) bool {
	other := false
	for _, p := range ps {
		owner, ok := v.ring.Owner(c.reqs[p.j].Key)
		if !ok {
			return false // no member left to try
		}
		other = other || owner.Name != f.to.Name
	}
	return other
}
