package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// Borrowing: a check with a ceiling has its own limit, its guarantee, and
// may borrow beyond it, up to its ceiling, while its parent, a limit
// shared by every key that names it, has room. Three counters decide it,
// at the key's owner:
//
//   - the check's own (limiter.RoleLimit): its guarantee;
//   - its ceiling counter, of the same name, key and algorithm
//     (limiter.RoleCeiling), of ceiling hits per period: everything the
//     key admitted, guaranteed or borrowed, so nothing is ever admitted
//     above the ceiling;
//   - the parent: the counter of the check's name and the parent's key,
//     of the parent's limit, kept cluster-wide by package global (see
//     global.Node.Borrow and Force).
//
// Hits the own and the ceiling counter both admit are guaranteed: both
// are charged (one store call, all or nothing, as they share the key's
// shard), and so is the parent, forced: whether it has room or not.
// Otherwise the hits are borrowed if the ceiling counter admits them and
// the parent has room for them then: the ceiling and the parent are
// charged, not the own counter. Else the check is refused. A check is
// guaranteed whole or borrows all its hits. The steps run one after
// another, without holding one lock while taking the next: package
// global locks its shard and then the store's, so the service must never
// call it under a store lock. So a concurrent check of the same key may
// take the ceiling's last room between the parent's yes and the ceiling's
// charge: the check is then refused and the parent keeps the charge (it
// refuses a little more, never admits more).

// borrowing is how a check with a ceiling borrows (see above): its
// ceiling counter's request, and its parent's, as a request of the store
// and as the GLOBAL check the parent's owner decides.
type borrowing struct {
	ceiling    limiter.Request
	parent     limiter.Request
	parentItem *pb.CheckItem
}

// borrowingOf returns how r, the request of item, borrows, or nil if item
// has no ceiling. item has passed checks.Request.
func borrowingOf(item *pb.CheckItem, r *limiter.Request) *borrowing {
	if item.Ceiling == 0 {
		return nil
	}
	b := &borrowing{ceiling: *r, parent: *r}
	b.ceiling.Role = limiter.RoleCeiling
	b.ceiling.Limit = algorithms.Limit{Count: item.Ceiling, Period: r.Limit.Period}
	if r.Limit.Burst > item.Ceiling {
		b.ceiling.Limit.Burst = r.Limit.Burst
	}
	p := item.GetParent()
	period := r.Limit.Period
	if p.DurationMs > 0 {
		period = time.Duration(p.DurationMs) * time.Millisecond
	}
	b.parent = limiter.Request{Name: r.Name, Key: p.Key, Algorithm: r.Algorithm,
		Limit: algorithms.Limit{Count: p.Limit, Period: period}, Hits: r.Hits, Now: r.Now}
	b.parentItem = &pb.CheckItem{Name: r.Name, Key: p.Key, Hits: &b.parent.Hits, Limit: p.Limit,
		DurationMs: period.Milliseconds(), Algorithm: item.Algorithm, Behavior: pb.Behavior_GLOBAL,
		CreatedAtMs: item.CreatedAtMs}
	return b
}

// borrow decides r, which borrows as b says, at its key's owner (see
// above), and reports whether its hits were admitted by borrowing. The
// decision's Remaining and ResetAfter are those of r's own counter, its
// guarantee; its Delay (LEAKY_BUCKET) that of the counter that admitted:
// the own, or the ceiling when borrowed.
func (s *Service) borrow(ctx context.Context, c *call, r *limiter.Request, b *borrowing) (d algorithms.Decision, borrowed bool) {
	parentOwner, _ := c.ring.Owner(b.parent.Key)
	if parentOwner.Name == "" {
		parentOwner = s.cluster.LocalMember() // no ring: a single node
	}
	own, ceiling := *r, b.ceiling
	if r.Reset { // forget the own and the ceiling counter, not the parent
		pair := [2]limiter.Request{own, ceiling}
		pair[0].Hits, pair[1].Hits, pair[1].MinInterval = 0, 0, 0
		s.store.DecideAll(pair[:], make([]algorithms.Decision, 2))
		own.Reset, ceiling.Reset = false, false
	}
	pair := [2]limiter.Request{own, ceiling}
	pair[1].MinInterval = 0 // the spacing goes with the own counter
	var ds [2]algorithms.Decision
	if err := s.store.TryAll(pair[:], ds[:]); errors.Is(err, limiter.ErrNotHeld) {
		c.notHeld = true // pulled, and its counter has left: decided nothing, the parent is not asked
		return ds[0], false
	}
	d = ds[0]
	if d.Allowed {
		s.global.Force(&b.parent, parentOwner.Name)
		return d, false
	}
	// Beyond the guarantee: borrow, with the spacing, if the ceiling and
	// then the parent have room.
	if peek := s.store.Check(&ceiling); !peek.Allowed {
		d.RetryAfter = algorithms.LongerWait(d.RetryAfter, peek.RetryAfter)
		s.metrics.borrow(borrowCeiling)
		return d, false
	}
	p, reached := s.decideParent(ctx, b, parentOwner)
	if !p.Allowed {
		if reached {
			d.RetryAfter = algorithms.ShorterWait(d.RetryAfter, p.RetryAfter) // the guarantee's room, or the parent's
			s.metrics.borrow(borrowParent)
		} else {
			s.metrics.borrow(borrowUnreachable)
		}
		return d, false
	}
	taken := s.store.Decide(&ceiling)
	if !taken.Allowed { // a concurrent check took the ceiling's room: the parent keeps the charge
		d.RetryAfter = algorithms.LongerWait(d.RetryAfter, taken.RetryAfter)
		s.metrics.borrow(borrowCeiling)
		return d, false
	}
	d.Allowed, d.RetryAfter, d.Delay = true, 0, taken.Delay
	s.metrics.borrow(borrowAdmitted)
	return d, true
}

// decideParent decides the borrowed hits of b's parent, whose owner is
// owner: from this node's grant, or as the owner (package global), or,
// when global says the owner must decide, by sending the owner the GLOBAL
// check of the parent at once. It reports whether the parent was decided;
// if its owner could not be reached the check borrows nothing.
func (s *Service) decideParent(ctx context.Context, b *borrowing, owner ring.Member) (d algorithms.Decision, reached bool) {
	d, forward := s.global.Borrow(&b.parent, owner.Name)
	if !forward {
		return d, true
	}
	resp, err := s.send(ctx, owner, true, routeForward, &pb.CheckRequest{Requests: []*pb.CheckItem{b.parentItem}})
	if err == nil && (len(resp.GetResponses()) != 1 || resp.GetResponses()[0].GetError() != "") {
		err = fmt.Errorf("parent's owner answered %v", resp.GetResponses())
	}
	if err != nil {
		if s.logSampler.allow(owner.Name, s.now()) {
			s.log.Warn("parent's owner unreachable: no borrowing (logged once a second per owner)", "owner", owner.Name, "err", err)
		}
		return algorithms.Decision{}, false
	}
	res := resp.GetResponses()[0]
	d = algorithms.Decision{Allowed: res.GetStatus() == pb.Status_UNDER_LIMIT, RetryAfter: algorithms.Never}
	if res.GetRetryAfterMs() >= 0 {
		d.RetryAfter = time.Duration(res.GetRetryAfterMs()) * time.Millisecond
	}
	return d, true
}
