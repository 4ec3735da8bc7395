package custody

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/strict"
)

// A Check is a check this node is about to decide, as custody sees it.
type Check struct {
	// Req is the store's request; Prepare sets its StandIn and Held.
	Req *limiter.Request
	// Owned says this node decides it as its key's owner (strict mode
	// fences such checks); Local says it is a LOCAL check, this node's
	// own, of which custody knows nothing.
	Owned, Local bool
	// Landed says it was relayed or re-planned here as its key's owner or
	// heir: decided here whatever the ring says, its owner's replica taken
	// in first. Recheck says it may be another node's by now (forwarded
	// here, or this node is leaving): where its counter is is looked at
	// again.
	Landed, Recheck bool
	// Global says package global decides it, at once: no counter is
	// awaited for it, nor is it looked at again.
	Global bool
	// KeepFence says a graceful leave does not lift strict mode's fence
	// from it: it is GLOBAL, or has a ceiling (see package strict).
	KeepFence bool
	// Borrows says it has a ceiling: it is decided after Prepare's release,
	// as it may wait on its parent's owner, and only where its counter is
	// (never kept here on the condition that its counter stays).
	Borrows bool
	// Verdict is Prepare's answer.
	Verdict Verdict
}

// Kind is what a check needs, as Prepare answers it.
type Kind uint8

const (
	// Ready: decide it here. If its request is Req.Held, only on a
	// counter held here: a store that finds none decides nothing, and the
	// check goes to Verdict.To.
	Ready Kind = iota
	// GoTo: relay it to Verdict.To, which decides it where it lands.
	GoTo
	// Refuse: do not decide it, for Verdict.Err.
	Refuse
)

// A Verdict is what Prepare answers for a check.
type Verdict struct {
	Kind Kind
	// To is the member a GoTo check is relayed to, or where a Ready
	// check decided only on a counter held here goes if there is none
	// (nil: decided on whatever is here).
	To *ring.Member
	// Err is why a check is refused: ErrFenced, or an error wrapping
	// checks.ErrUnavailable (its counter did not come in time, or its
	// client has gone).
	Err error
}

// A Release ends what Prepare holds off (see Prepare). The zero Release
// holds nothing.
type Release struct {
	c      *Custody
	unhold func() // a leaving node's hold on its hand-off rounds, or nil
}

// Done releases r, once the store has decided the ready checks but those
// that borrow.
func (r Release) Done() {
	if r.unhold != nil {
		r.unhold()
	}
	if r.c != nil {
		r.c.deciding.RUnlock()
	}
}

// ErrFenced is the Err of a check strict mode refuses: this node may not
// decide it (no quorum, or its key's last owner may still be deciding
// it), and answers it from escrow (see package strict).
var ErrFenced = errors.New("strict mode: not decided here")

// Prepare answers, for each of cks, which the caller routed by ring
// routed, what it needs before this node decides it, in its Verdict: the
// caller decides the Ready ones on the store, calls the Release's Done,
// then decides those that borrow, and sends the GoTo ones. began is when
// the checks began to wait for this node to join (AwaitJoin), or zero;
// all says they are an all-or-nothing request, never split. In order:
// LOCAL is ready; strict mode's fence (Fence.Judge); a landed check's
// replica promoted (replica.Node.PromoteKey), decided as a stand-in's; a
// GLOBAL check is ready; a counter on its way awaited
// (handoff.Node.AwaitCounter), refused at halfway to the deadline. Then,
// under the hold the Release lets go of, checks that may have moved are
// looked at again (settle). See docs/design-cluster.md, "Custody: what a
// key needs".
func (c *Custody) Prepare(ctx context.Context, routed *ring.Ring, began time.Time, all bool, cks []Check) Release {
	var now time.Time
	self := c.cluster.LocalMember()
	var noTime error
	stored := 0 // checks that reach the store
	for i := range cks {
		k := &cks[i]
		k.Verdict = Verdict{}
		if k.Local {
			stored++
			continue
		}
		if k.Owned && c.fence.On() {
			if now.IsZero() {
				now = c.now() // the server's clock, not a check's created_at_ms: a client cannot shorten a fence
			}
			switch c.fence.Judge(k.Req, k.KeepFence, c.Ring(), self.Name, c.holds, now) {
			case strict.Refuse:
				k.Verdict = Verdict{Kind: Refuse, Err: ErrFenced}
				continue
			case strict.Charge:
				spend := *k.Req
				spend.Hits, spend.Reset = k.Req.Limit.Capacity(), false
				c.store.Charge(&spend)
			}
		}
		if k.Landed {
			c.replica.PromoteKey(k.Req) // relayed here as the key's heir: its owner cannot be reached
			if !k.Global {
				k.Req.StandIn = c.standIn(routed, k.Req.Key, self)
			}
		}
		if k.Global {
			continue
		}
		// Its counter may be on its way here; with no time left to wait
		// for it, it is answered, not decided.
		late, err := c.handoff.AwaitCounter(ctx, routed, k.Req.Key, began, c.mayAnswer)
		if err != nil {
			noTime = fmt.Errorf("%w: %w", checks.ErrUnavailable, err)
			k.Verdict = Verdict{Kind: Refuse, Err: noTime}
			continue
		}
		k.Req.StandIn = k.Req.StandIn || late
		stored++
	}
	if stored == 0 {
		return Release{}
	}
	var refused error
	switch {
	case noTime != nil && all: // an all-or-nothing request is never split
		refused = noTime
	case ctx.Err() != nil: // its sender gave up while they waited, and may have had them decided elsewhere
		refused = fmt.Errorf("%w: %w", checks.ErrUnavailable, ctx.Err())
	}
	if refused != nil {
		for i := range cks {
			if cks[i].Verdict.Kind == Ready && !cks[i].Global {
				cks[i].Verdict = Verdict{Kind: Refuse, Err: refused}
			}
		}
		return Release{}
	}
	c.deciding.RLock() // Leave waits for these decisions, or they see it
	release := Release{c: c}
	if c.Leaving() {
		release.unhold = c.handoff.Hold(ctx)
	}
	c.settle(routed, all, cks) // under the Hold: where each counter is now
	return release
}

// standIn reports whether a check of key, routed by r and decided here as
// one relayed or re-planned to this node, is decided for another owner:
// its key's owner in r is not self. If so the owner gets the counter back
// once it answers again (Watch.StandIn).
func (c *Custody) standIn(r *ring.Ring, key string, self ring.Member) bool {
	owner, ok := r.Owner(key)
	if !ok || owner.Name == self.Name {
		return false
	}
	c.watch.StandIn(owner.PeerAddr, time.Now())
	return true
}

// mayAnswer reports whether a key's previous owner, from, whose counter
// is late, may yet say it has handed it over: not while this node
// suspects it. A check whose counter is late waits for that word again
// (handoff.Node.AwaitCounter), until halfway to its deadline, and is then
// refused; one whose previous owner this node suspects is decided as a
// stand-in's at once.
func (c *Custody) mayAnswer(from ring.Member) bool { return !c.watch.Suspect(from.PeerAddr) }

// settle takes, out of cks, the Ready checks whose counter is elsewhere
// (the ring this node routes by now gives the key to another node, and
// no counter for it is here) and makes them GoTo that owner. Those whose
// counter is here stay, decided only on a counter held here (Req.Held,
// their To the owner), since a round of hand-off may take it out between
// this look and the decision; but those that borrow, decided apart. Only
// checks that may have moved are looked at: marked Recheck, or routed by
// an older ring. An all-or-nothing request stays whole for each key, and
// landed checks are decided where they land. See docs/design-cluster.md,
// "Custody: what a key needs".
func (c *Custody) settle(routed *ring.Ring, all bool, cks []Check) {
	now := c.Ring()
	self := c.cluster.LocalMember().Name
	moved := false
	for i := range cks {
		k := &cks[i]
		if k.Verdict.Kind != Ready || k.Global {
			continue
		}
		owner, ok := away(k, routed, now, self)
		if !ok {
			continue
		}
		switch {
		case !c.holds(k.Req):
			k.Verdict = Verdict{Kind: GoTo, To: onHeap(owner)}
			moved = true
		case !all && !k.Borrows:
			k.Verdict.To = onHeap(owner)
			k.Req.Held = true
		}
	}
	if !moved || !all {
		return
	}
	// A counter of the request is elsewhere: every check whose key another
	// node owns goes there, held here or not, so that the key's checks are
	// decided together.
	for i := range cks {
		k := &cks[i]
		if k.Verdict.Kind != Ready || k.Global {
			continue
		}
		if owner, ok := away(k, routed, now, self); ok {
			k.Verdict = Verdict{Kind: GoTo, To: onHeap(owner)}
		}
	}
}

// onHeap returns a pointer to a copy of m: only the checks that move pay
// for one.
func onHeap(m ring.Member) *ring.Member { return &m }

// away returns the owner of k's key, if the check may have moved (see
// settle) and now, the ring this node routes by, gives its key to
// another node than self; routed is the ring it was routed by.
func away(k *Check, routed, now *ring.Ring, self string) (ring.Member, bool) {
	if k.Landed || (!k.Recheck && now == routed) || k.Local {
		return ring.Member{}, false
	}
	owner, ok := now.Owner(k.Req.Key)
	return owner, ok && owner.Name != self
}
