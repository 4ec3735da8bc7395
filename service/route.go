package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/custody"
	"github.com/ringlimit/ringlimit/heal"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// maxRounds bounds the rounds of a request's plan (see plan.go). A check
// is re-planned only when its send fails, and each failure moves it on
// along forward, forward again at its key's new owner (once), relay to the
// first member of its key's succession this node can reach (at most
// maxHops times, see failOver), and this node's share, which decides it
// here; a relay that is not a failover is relayed again at the new owner
// (once) before the share, and a pull that fails is decided here next. So
// no check takes more than 3+maxHops rounds; a check left pending after
// them would be a bug in replan, and is answered with an internal error,
// not dropped.
const maxRounds = 3 + maxHops

// errNoRoute is the error of a check still pending after maxRounds.
var errNoRoute = fmt.Errorf("no route after %d rounds", maxRounds)

// decide decides the checks ps of c, in rounds: each takes the view,
// re-plans what failed in the round before, plans, and carries the plan
// out (see plan.go). It returns once every check of ps has its result.
func (s *Service) decide(ctx context.Context, c *call, ps []pending) {
	var failedOver []int // checks that went to their heir, by index into c.reqs
	var escrowed []int   // strict mode: checks answered from a grant while their owner cannot be reached
	for range maxRounds {
		// The replicas of keys this node has just inherited (their owner
		// left the ring) become its counters first, so that none is
		// decided without them.
		s.custody.Promote(c.ring)
		v := s.look(ctx)
		failedOver = s.replanFailed(c, ps, &v, failedOver)
		s.askGlobal(ctx, c, ps, &v)
		escrowed = s.fromEscrow(c, ps, &v, escrowed)
		ps = s.carry(ctx, c, ps, plan(c, ps, &v), &v)
		if len(ps) == 0 {
			break
		}
	}
	for _, p := range ps {
		c.results[c.pos[p.j]] = errorResult(errNoRoute)
	}
	for _, j := range failedOver {
		r := c.results[c.pos[j]]
		if r.GetError() == "" && r.Metadata[MetadataDecidedBy] == "" { // a heir that could not be reached marked its fallback
			r.Metadata = map[string]string{MetadataDecidedBy: routeFailover}
		}
	}
	markEscrow(c, escrowed)
}

// look returns the node's view now (see view).
func (s *Service) look(ctx context.Context) view {
	return view{self: s.cluster.LocalMember(), ring: s.custody.Ring(), leaving: s.custody.Leaving(), gone: ctx.Err(),
		handOff: s.custody, store: s.custody, heirs: s.custody.Heirs(), suspect: s.heal.Suspect, strict: s.strict.On()}
}

// replanFailed re-plans the checks of ps whose send failed, those of one
// send together (see replan), counts and logs what their failures taught,
// and returns failedOver with the checks that go to their heir added.
func (s *Service) replanFailed(c *call, ps []pending, v *view, failedOver []int) []int {
	for k := range ps {
		f := ps[k].failed
		if f == nil {
			continue
		}
		var sent []*pending // the checks f's send carried
		for i := k; i < len(ps); i++ {
			if ps[i].failed == f {
				ps[i].failed = nil
				sent = append(sent, &ps[i])
			}
		}
		switch replan(c, sent, f, v) {
		case lessonFailover:
			if f.kind == routeForward { // a failover that goes on to the next member counts once
				s.metrics.failovers.Add(float64(len(sent)))
			}
			for _, p := range sent {
				failedOver = append(failedOver, p.j)
			}
		case lessonShare:
			s.heal.Unreachable(f.to.Name, "owner unreachable, deciding locally with this node's share", f.err)
			s.metrics.forwardErrors.Inc()
		}
	}
	return failedOver
}

// askGlobal asks package global about the GLOBAL checks of ps that plan
// may decide here, and puts its answers in v: those going as their
// owner's check, with the owner's name (this node's if it owns the key),
// and those to be decided here as the owner, which custody prepares first
// (strict mode may refuse them; a replica this node holds becomes their
// counter). Asking decides a check when global can (it charges a grant,
// or the owner's lease); when it cannot, the check goes to its owner.
func (s *Service) askGlobal(ctx context.Context, c *call, ps []pending, v *view) {
	for k := range ps {
		p := &ps[k]
		if c.behavior(p.j) != pb.Behavior_GLOBAL || (p.next != nextOwner && p.next != nextHere) {
			continue
		}
		if v.global == nil {
			v.global = make([]answer, len(ps))
		}
		owner := p.to.Name
		if p.next == nextHere || v.owns(p.to) {
			owner = v.self.Name
		}
		r := &c.reqs[p.j]
		if owner == v.self.Name && p.next != nextHere && v.leaving && !v.store.Holds(r) {
			// Leaving, and the counter handed over: not this node's to
			// decide as the owner any more, but the new owner's, on the
			// counter (this node's grant, if it has one, still spends).
			if m, ok := v.ring.Owner(r.Key); ok && m.Name != v.self.Name {
				p.to, owner = m, m.Name
			}
		}
		if owner == v.self.Name {
			ck := [1]custody.Check{{Req: r, Owned: true, Global: true, KeepFence: true, Landed: p.next == nextHere}}
			var verdict [1]custody.Verdict
			s.custody.Prepare(ctx, c.ring, c.began, c.all, ck[:], verdict[:])
			if verdict[0].Kind == custody.Refuse {
				p.next = nextEscrow
				continue
			}
		}
		d, forward := s.global.Decide(r, owner)
		v.global[k] = answer{d: d, decided: !forward}
	}
}

// carry carries out one round: the routes of ps, planned with v. It
// decides here the checks routed here, then sends the others, all at
// once, and records the answers. It returns the checks whose send failed,
// each with its failure, for the next round; ps is reused for them.
func (s *Service) carry(ctx context.Context, c *call, ps []pending, routes []route, v *view) []pending {
	var nHere, nShare int
	for _, r := range routes {
		switch r.kind {
		case routeLocal:
			nHere++
		case routeFallback:
			nShare++
		}
	}
	// One slice holds, in turn, the checks decided here (indexes into ps),
	// those decided with a share (into c.reqs) and those sent (into ps).
	all := make([]int, len(routes))
	here, share, sent := all[:0:nHere], all[nHere:nHere:nHere+nShare], all[nHere+nShare:nHere+nShare]
	for k, r := range routes {
		j := ps[k].j
		switch r.kind {
		case routeLocal:
			here = append(here, k)
		case routeGlobal:
			s.setResult(c, j, v.global[k].d, routeGlobal)
		case routeFallback:
			share = append(share, j)
		case routeEscrow:
			s.refuseEscrow(c, j)
		case routeGone:
			c.results[c.pos[j]] = goneResult(ctx)
		default:
			sent = append(sent, k)
		}
	}
	sent = append(sent, s.decideHere(ctx, c, ps, routes, here, v)...)
	s.decideFallback(ctx, c, share)
	sends := groupSends(c, ps, routes, sent)
	s.sendAll(ctx, sends)
	failed := false
	for _, sd := range sends {
		err, answered := sd.err, false
		if err == nil && len(sd.resp.GetResponses()) != len(sd.ks) {
			err, answered = errors.New("owner answered the wrong number of results"), true
		}
		if err != nil {
			f := &failure{kind: sd.kind, to: sd.to, retried: sd.retried, err: err, answered: answered}
			for _, k := range sd.ks {
				ps[k].failed = f
			}
			failed = true
			continue
		}
		// The owner decided, and counted, these checks; here they count
		// only as forwarded, so that summing decisions over a cluster
		// counts each check once.
		for i, k := range sd.ks {
			j := ps[k].j
			c.results[c.pos[j]] = sd.resp.Responses[i]
			s.metrics.forwarded(c.behavior(j))
		}
	}
	if !failed {
		return nil
	}
	next := ps[:0] // filtered in place: next never passes the check being read
	for _, p := range ps {
		if p.failed != nil {
			next = append(next, p)
		}
	}
	return next
}

// decideHere decides the checks of ps routed to this node's store (ks,
// indexes into ps and routes), as plan routed them, and returns those
// that are to be relayed instead, their routes made relays. custody
// prepares each first (one verdict a check: see custody.Custody.Prepare):
// the ready ones are decided on the store, and then, once custody's hold
// is released, those that borrow, which may wait on a parent's owner; a
// check kept here only while its counter is here, whose counter left
// before the store decided it, goes to the key's owner.
func (s *Service) decideHere(ctx context.Context, c *call, ps []pending, routes []route, ks []int, v *view) (relayed []int) {
	if len(ks) == 0 {
		return nil
	}
	cks := make([]custody.Check, len(ks))
	verdicts := make([]custody.Verdict, len(ks))
	for i, k := range ks {
		p := &ps[k]
		b := c.behavior(p.j)
		cks[i] = custody.Check{Req: &c.reqs[p.j], Owned: p.next == nextHere || (p.next == nextOwner && v.owns(p.to)),
			Local: b == pb.Behavior_LOCAL, Landed: routes[k].landed, Recheck: routes[k].recheck,
			KeepFence: c.borrowing(p.j) != nil, Borrows: c.borrowing(p.j) != nil}
	}
	release := s.custody.Prepare(ctx, c.ring, c.began, c.all, cks, verdicts)
	var kept []int // indexes into ks of the checks kept here only while their counter is
	js := make([]int, 0, len(ks))
	for i, k := range ks {
		j := ps[k].j
		switch vd := &verdicts[i]; {
		case vd.Kind == custody.Refuse && errors.Is(vd.Err, custody.ErrFenced):
			s.refuseEscrow(c, j)
		case vd.Kind == custody.Refuse:
			c.results[c.pos[j]] = errorResult(vd.Err)
		case vd.Kind == custody.GoTo:
			routes[k] = route{kind: routeRelay, to: &vd.To}
			relayed = append(relayed, k)
		default:
			if vd.To.Name != "" {
				kept = append(kept, i)
			}
			js = append(js, j)
		}
	}
	js, borrowing := splitBorrowing(c, js)
	s.decideLocal(ctx, c, js, routeLocal)
	release()
	s.decideLocal(ctx, c, borrowing, routeLocal)
	for _, i := range kept {
		k := ks[i]
		j := ps[k].j
		c.reqs[j].Held = false
		if c.results[c.pos[j]] == nil { // its counter left before the store decided: nothing was
			routes[k] = route{kind: routeRelay, to: &verdicts[i].To}
			relayed = append(relayed, k)
		}
	}
	return relayed
}

// goneResult is the result of a check whose client has gone before it was
// decided: nothing is charged on its behalf.
func goneResult(ctx context.Context) *pb.CheckResult {
	return errorResult(fmt.Errorf("%w: %w", checks.ErrUnavailable, ctx.Err()))
}

// splitBorrowing splits c.reqs[js] into those without a ceiling and those
// with one, in place.
func splitBorrowing(c *call, js []int) (plain, borrowing []int) {
	if c.borrows == nil {
		return js, nil
	}
	plain = js[:0] // filtered in place: plain never passes the check being read
	for _, j := range js {
		if c.borrowing(j) != nil {
			borrowing = append(borrowing, j)
			continue
		}
		plain = append(plain, j)
	}
	return plain, borrowing
}

// A send is checks of one request that go to one node together: one
// forward, relay or pull. Only the goroutine that sends it writes resp
// and err, and only once it is done are they read.
type send struct {
	kind    routeKind
	to      ring.Member
	batched bool // handed to the node's batch (peer.Pool.Start); else an RPC of its own
	retried bool
	ks      []int // the checks it carries: indexes into the round's pending checks
	req     *pb.CheckRequest
	resp    *pb.CheckResponse
	err     error
}

// groupSends groups the checks ks of ps, routed to other nodes, into
// sends: BATCHED forwards bound for one node share a send (the peer pool
// batches it further with other requests); an UNBATCHED forward, a relay
// and a pull are sends of their own, one RPC each. With c.all every check
// bound for one node the same way shares a send, sent at once if all are
// UNBATCHED: items with the same key have the same owner, so an
// all-or-nothing group is never split.
func groupSends(c *call, ps []pending, routes []route, ks []int) []*send {
	if len(ks) == 0 {
		return nil
	}
	// shared are the sends that checks join: the batched send to each
	// node, and with c.all every send. A cluster has few nodes, so they
	// are searched in turn rather than kept in a map.
	var sends, shared []*send
	for _, k := range ks {
		r, p := routes[k], &ps[k]
		unbatched := c.behavior(p.j) == pb.Behavior_UNBATCHED || r.kind != routeForward
		var sd *send
		for _, sh := range shared {
			if sh.to.Name == r.to.Name && sh.kind == r.kind && sh.retried == p.retried {
				sd = sh
				break
			}
		}
		if sd == nil || (unbatched && !c.all) {
			sd = &send{kind: r.kind, to: *r.to, batched: !unbatched, retried: p.retried,
				req: &pb.CheckRequest{All: c.all}}
			sends = append(sends, sd)
			if !unbatched || c.all {
				shared = append(shared, sd)
			}
		}
		sd.batched = sd.batched || !unbatched
		sd.ks = append(sd.ks, k)
		sd.req.Requests = append(sd.req.Requests, c.items[c.pos[p.j]])
	}
	return sends
}

// sendAll sends each send to its node and records its answer in it.
// Batched sends are handed to their nodes' batches all at once, and
// waited for here, one after another: no goroutine a send, which would
// cost more than most forwards. A send that goes in an RPC of its own
// (UNBATCHED, relayed, pulled) is sent from a goroutine of its own when
// there are others.
func (s *Service) sendAll(ctx context.Context, sends []*send) {
	switch len(sends) {
	case 0:
		return
	case 1: // the common case
		sd := sends[0]
		sd.resp, sd.err = s.send(ctx, sd)
		return
	}
	started := make([]*heal.Sending, len(sends))
	var wg sync.WaitGroup
	for i, sd := range sends {
		if !sd.batched {
			wg.Go(func() { sd.resp, sd.err = s.send(ctx, sd) })
			continue
		}
		started[i] = s.heal.Start(ctx, sd.to, sd.req)
	}
	for i, sd := range sends {
		if started[i] != nil {
			sd.resp, sd.err = s.heal.Finish(ctx, started[i])
		}
	}
	wg.Wait()
}

// send sends sd and waits for its answer, through package heal, which
// refuses at once a send to a member it suspects.
func (s *Service) send(ctx context.Context, sd *send) (*pb.CheckResponse, error) {
	switch {
	case sd.batched:
		return s.heal.Forward(ctx, sd.to, sd.req)
	case sd.kind == routePull:
		return s.heal.Send(ctx, sd.to, heal.Pull, sd.req)
	case sd.kind == routeRelay:
		return s.heal.Send(ctx, sd.to, heal.Relay, sd.req)
	}
	return s.heal.Send(ctx, sd.to, heal.Forward, sd.req)
}

// decideFallback decides c.reqs[js] on this node with its share of each
// limit (limit / members, at least 1), so that a cluster cut off from an
// owner admits about the limit in total rather than members times it. The
// answer's limit is that share, so a caller can see it was not the whole.
// A spacing's share is its interval times members (see spacingShare). A
// check with a ceiling borrows nothing: its parent's owner may be as far
// out of reach as its own.
func (s *Service) decideFallback(ctx context.Context, c *call, js []int) {
	if len(js) == 0 {
		return
	}
	members := int64(max(1, s.cluster.Ring().Len()))
	for _, j := range js {
		if c.borrows != nil {
			c.borrows[j] = nil
		}
		r := &c.reqs[j]
		if r.Algorithm == limiter.Spacing {
			r.Limit = limiter.SpacingLimit(spacingShare(r.Limit.Period, members))
			continue
		}
		r.Limit = shareOf(r.Limit, members)
		r.MinInterval = spacingShare(r.MinInterval, members)
		r.StandIn = true // the key's counter is its owner's: what this share admits is added to it where they meet (package heal)
	}
	s.decideLocal(ctx, c, js, routeFallback)
	for _, j := range js {
		c.results[c.pos[j]].Metadata = map[string]string{MetadataDecidedBy: routeFallback.String()}
	}
}

// shareOf is one member's share of l: Count and Burst divided by members,
// rounded down but at least 1.
func shareOf(l algorithms.Limit, members int64) algorithms.Limit {
	l.Count = max(1, l.Count/members)
	if l.Burst > 0 {
		l.Burst = max(1, l.Burst/members)
	}
	return l
}

// spacingShare is one member's share of a spacing of interval d: members
// times d, so that members spacing apart admit about one request per d in
// all, as shares of a limit do (requests that reach two members may then
// come closer together than d: only the owner keeps the spacing exact).
// It is at most checks.MaxDuration, the longest interval a check may ask
// for, so that the counter it leaves is one a check could have made.
func spacingShare(d time.Duration, members int64) time.Duration {
	if d > checks.MaxDuration/time.Duration(members) {
		return checks.MaxDuration
	}
	return d * time.Duration(members)
}
