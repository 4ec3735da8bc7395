package service

import (
	"context"
	"errors"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/custody"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

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
	cks := s.custodyChecks(c, len(ks))
	for i, k := range ks {
		p := &ps[k]
		b := c.behavior(p.j)
		cks[i] = custody.Check{Req: &c.reqs[p.j], Owned: p.next == nextHere || (p.next == nextOwner && v.owns(p.to)),
			Local: b == pb.Behavior_LOCAL, Landed: routes[k].landed, Recheck: routes[k].recheck,
			KeepFence: c.borrowing(p.j) != nil, Borrows: c.borrowing(p.j) != nil}
	}
	defer s.putCustodyChecks(c, cks)
	release := s.custody.Prepare(ctx, c.ring, c.began, c.all, cks)
	var kept []keptHere
	js := ks[:0] // the checks decided here, as indexes into c.reqs, in place: js never passes the check being read
	for i, k := range ks {
		j := ps[k].j
		switch vd := &cks[i].Verdict; {
		case vd.Kind == custody.Refuse && errors.Is(vd.Err, custody.ErrFenced):
			s.refuseEscrow(c, j)
		case vd.Kind == custody.Refuse:
			c.results[c.pos[j]] = errorResult(vd.Err)
		case vd.Kind == custody.GoTo:
			routes[k] = route{kind: routeRelay, to: vd.To}
			relayed = append(relayed, k)
		default:
			if vd.To != nil {
				kept = append(kept, keptHere{k: k, owner: vd.To})
			}
			js = append(js, j)
		}
	}
	js, borrowing := splitBorrowing(c, js)
	s.decideLocal(ctx, c, js, routeLocal)
	release.Done()
	s.decideLocal(ctx, c, borrowing, routeLocal)
	for _, h := range kept {
		j := ps[h.k].j
		c.reqs[j].Held = false
		if c.results[c.pos[j]] == nil { // its counter left before the store decided: nothing was
			routes[h.k] = route{kind: routeRelay, to: h.owner}
			relayed = append(relayed, h.k)
		}
	}
	return relayed
}

// keptHere is a check custody keeps here only while its counter is here
// (limiter.Request.Held), and its key's owner, where it goes if the store
// found no counter.
type keptHere struct {
	k     int // index into the pending checks
	owner *ring.Member
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

// decideLocal decides c.reqs[js] against this node's store. With c.all,
// requests with the same key are decided together; a request with a
// ceiling borrows as package borrow says. route is recorded in the checks
// metric.
func (s *Service) decideLocal(ctx context.Context, c *call, js []int, route routeKind) {
	if len(js) == 0 {
		return
	}
	if !c.all {
		for _, j := range js {
			if ttl := c.reserveTTL(j); ttl > 0 {
				s.reserve(c, j, ttl, route)
				continue
			}
			b := c.borrowing(j)
			if b == nil {
				d, err := s.store.Try(&c.reqs[j])
				s.setDecided(c, j, d, err, route)
				continue
			}
			parentOwner, _ := c.ring.Owner(b.Parent.Key)
			if parentOwner.Name == "" {
				parentOwner = s.cluster.LocalMember() // no ring: a single node
			}
			d, borrowed, err := s.borrows.Decide(ctx, &c.reqs[j], b, parentOwner)
			if err != nil {
				c.notHeld = true // nothing decided (see setDecided)
				continue
			}
			s.setResult(c, j, d, route)
			if borrowed {
				c.results[c.pos[j]].Borrowed = true
			}
		}
		return
	}
	for _, group := range groupByKey(c.reqs, js) {
		if len(group) == 1 {
			j := js[group[0]]
			d, err := s.store.Try(&c.reqs[j])
			s.setDecided(c, j, d, err, route)
			continue
		}
		rs := make([]limiter.Request, len(group))
		ds := make([]algorithms.Decision, len(group))
		for g, k := range group {
			rs[g] = c.reqs[js[k]]
		}
		err := s.store.TryAll(rs, ds)
		for g, k := range group {
			s.setDecided(c, js[k], ds[g], err, route)
		}
	}
}

// setDecided records what the store answered for c.reqs[j]: its
// decision, or, when the store had no room for its counter
// (limiter.ErrFull), that error, as the item's (checks.Code: resource
// exhausted), so that the client learns why it was refused. A check to
// be decided only on a counter held here that found none
// (limiter.ErrNotHeld) gets no result, as nothing was decided: its caller
// sends it where the counter is (see keptHere and Owner.Pulled).
func (s *Service) setDecided(c *call, j int, d algorithms.Decision, err error, route routeKind) {
	if errors.Is(err, limiter.ErrNotHeld) {
		c.notHeld = true // nothing decided: no result, and nothing counted
		return
	}
	if err != nil {
		res := errorResult(err)
		res.RetryAfterMs = d.RetryAfter.Milliseconds()
		c.results[c.pos[j]] = res
		s.metrics.checked(c.reqs[j].Algorithm, c.items[c.pos[j]].Behavior, route, false)
		s.top.Record(c.reqs[j].Name, c.reqs[j].Key, false)
		return
	}
	s.setResult(c, j, d, route)
}

// setResult records the decision for c.reqs[j], decided on this node by
// route (routeLocal, routeGlobal or routeFallback).
func (s *Service) setResult(c *call, j int, d algorithms.Decision, route routeKind) {
	i := c.pos[j]
	checks.Result(&c.decided[i], &c.reqs[j], d)
	c.results[i] = &c.decided[i]
	s.metrics.checked(c.reqs[j].Algorithm, c.items[i].Behavior, route, d.Allowed)
	s.top.Record(c.reqs[j].Name, c.reqs[j].Key, d.Allowed)
}

// groupByKey returns positions in js grouped by the key of c.reqs[js[k]],
// groups in order of first appearance.
func groupByKey(reqs []limiter.Request, js []int) [][]int {
	byKey := make(map[string]int, len(js))
	var groups [][]int
	for k, j := range js {
		g, ok := byKey[reqs[j].Key]
		if !ok {
			g = len(groups)
			byKey[reqs[j].Key] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], k)
	}
	return groups
}
