package global

import (
	"math"
	"time"
)

// Rate shares: the owner's side of an Envoy stream. Envoy's
// rate_limit_quota filter refills each bucket's token bucket itself, so a
// stream is lent a rate share (rate r, burst b), not a grant of hits, and
// the owner splits a limit of L hits per window T so that the shares in
// force never sum to more than
//
//	rates:  R = (L - B) / T        bursts: B = max(L / BurstDivisor, streams), at most L
//
// A share that goes down stays reserved for ShareDelivery; one goes up
// only by what the others' reservations leave; a key this node has just
// come to own (tenure.go) raises none above what its streams claim for a
// lease time-to-live. Each stream's part is split (split.go) by its
// demand, with a floor. See docs/rlqs.md, "Rate shares".

// BurstDivisor sets the burst budget of a limit's shares: a 32nd of the
// limit (at least a hit a stream), so that the rates get the rest.
const BurstDivisor = 32

// ShareDelivery bounds the time a stream's new share takes from its
// owner's answer to the Envoy that applies it (relayed, then sent on the
// stream): a decreased share stays reserved at its old size that long.
const ShareDelivery = 250 * time.Millisecond

// shareAccount is one stream's rate share of a counter this node owns.
type shareAccount struct {
	epoch int64
	// rate (hits a second) and burst are the share as last answered;
	// prevRate and prevBurst the larger share it replaced, reserved until
	// prevUntil (ShareDelivery after the decrease was answered).
	rate, prevRate   float64
	burst, prevBurst float64
	prevUntil        time.Time
	expires          time.Time // freed at the first round after it, unless a report renews it
	answered         bool      // see lesseeAccount.answered
	admitted         int64     // the admitted total charged to the counter
	asked            int64     // asked total when demand was last measured, at askedAt
	askedAt          time.Time
	demand           float64 // hits a second, at most demandCap
}

// reserved is a's share as the owner counts it at now: the larger of the
// one answered and the one it replaced, while that may be in force.
func (a *shareAccount) reserved(now time.Time) (rate, burst float64) {
	rate, burst = a.rate, a.burst
	if now.Before(a.prevUntil) {
		rate, burst = max(rate, a.prevRate), max(burst, a.prevBurst)
	}
	return rate, burst
}

// set answers a's new share at now: a decrease keeps the old one reserved
// for ShareDelivery.
func (a *shareAccount) set(rate, burst float64, now time.Time) {
	if rate < a.rate || burst < a.burst {
		pr, pb := a.reserved(now)
		a.prevRate, a.prevBurst, a.prevUntil = pr, pb, now.Add(ShareDelivery)
	}
	a.rate, a.burst = rate, burst
}

// budget is what l's limit lends its shares: the rates' sum and the
// bursts' sum (see above), for n streams.
func (l *lease) budget(n int) (rate, burst float64) {
	count := float64(l.req.Limit.Count)
	burst = min(count, max(count/BurstDivisor, float64(n)))
	return (count - burst) / l.req.Limit.Period.Seconds(), burst
}

// lendShare takes one valid share report of lessee into l and returns its
// answer. sh.mu is held.
func (n *Node) lendShare(sh *shard, l *lease, lessee Lessee, rep *LeaseReport, now time.Time) LeaseGrant {
	if l.shares == nil {
		l.shares = make(map[Lessee]*shareAccount)
		l.raiseFrom = now.Add(n.leases.TTL)
		if n.tenure.held(n.cluster.Ring(), n.cluster.LocalMember().Name, l.req.Key, now, n.tenureWindow()) {
			l.raiseFrom = now // no other shares of the key can be in force
		}
	}
	a := l.shares[lessee]
	switch {
	case a == nil:
		if err := sh.book.open(lessee, len(l.lessees)+len(l.shares)); err != nil {
			return LeaseGrant{Err: err}
		}
		a = n.newShare(l, rep, now)
		l.shares[lessee] = a
	case rep.Epoch > a.epoch && !rep.Release:
		// The stream started the account again (a changed policy): what
		// the old one lent may be in force until the new answer arrives.
		old := a
		a = n.newShare(l, rep, now)
		a.prevRate, a.prevBurst = old.reserved(now)
		a.prevUntil = now.Add(ShareDelivery)
		l.shares[lessee] = a
	case rep.Epoch < a.epoch:
		return n.shareGrant(l, a, now)
	}
	if delta := rep.Admitted - a.admitted; delta > 0 {
		c := l.req
		c.Now, c.Hits = rep.Request.Now, delta
		n.store.Charge(&c) // the counter shows what the streams admitted; the shares, not the counter, bound them
		a.admitted = rep.Admitted
	}
	if dt := now.Sub(a.askedAt); rep.Asked > a.asked && dt >= n.interval {
		a.demand = min(float64(rep.Asked-a.asked)/dt.Seconds(), demandCap(l.req.Limit, max(n.interval, rep.Interval)))
		a.asked, a.askedAt = rep.Asked, now
	}
	a.expires = now.Add(n.leases.TTL)
	if rep.Release {
		a.epoch = max(a.epoch, rep.Epoch)
		a.set(0, 0, now)
		a.expires = now.Add(ShareDelivery) // nothing left to renew
		return n.shareGrant(l, a, now)
	}
	if !a.answered {
		n.claimShare(l, a, float64(rep.ShareRateMilli)/1000, float64(rep.ShareBurst), now)
	}
	n.resplit(l, a, now)
	a.answered = true
	return n.shareGrant(l, a, now)
}

// newShare is a new account for rep, whose demand starts at the mean of
// the lease's other streams (none measured: a hit a sync round), so that
// a stream that comes back on another node (a drain) gets an equal part
// at once rather than its floor until its next report.
func (n *Node) newShare(l *lease, rep *LeaseReport, now time.Time) *shareAccount {
	demand, k := 0.0, 0
	for _, o := range l.shares {
		demand += o.demand
		k++
	}
	if k > 0 {
		demand /= float64(k)
	} else {
		demand = 1 / n.interval.Seconds()
	}
	return &shareAccount{epoch: rep.Epoch, admitted: rep.Admitted, asked: rep.Asked, askedAt: now, demand: demand}
}

// claimShare reserves for a, an account this owner did not answer, the
// share its stream says it holds, as far as the others leave room: that
// share is in force at the Envoy until an answer replaces it. sh.mu is
// held.
func (n *Node) claimShare(l *lease, a *shareAccount, rate, burst float64, now time.Time) {
	availRate, availBurst := n.shareRoom(l, a, now)
	a.rate = max(a.rate, min(rate, availRate))
	a.burst = max(a.burst, min(burst, availBurst))
}

// shareRoom is what the budget leaves a, beyond what l's other shares
// reserve at now. sh.mu is held.
func (n *Node) shareRoom(l *lease, a *shareAccount, now time.Time) (rate, burst float64) {
	rate, burst = l.budget(len(l.shares))
	for _, o := range l.shares {
		if o == a {
			continue
		}
		r, b := o.reserved(now)
		rate -= r
		burst -= b
	}
	return max(0, rate), max(0, burst)
}

// resplit moves a's share towards its part of the split: down at once,
// up as far as the others' reservations leave room, and not above its
// claim while the lease is new (see above). sh.mu is held.
func (n *Node) resplit(l *lease, a *shareAccount, now time.Time) {
	ps := make([]party, 0, len(l.shares))
	at := 0
	for _, o := range l.shares {
		if o == a {
			at = len(ps)
		}
		ps = append(ps, party{demand: o.demand, floor: 1 / (4 * float64(len(l.shares)))})
	}
	w := split(ps)[at]
	budgetRate, budgetBurst := l.budget(len(l.shares))
	rate := w * budgetRate
	burst := max(1, math.Floor(w*budgetBurst))
	if now.Before(l.raiseFrom) {
		rate, burst = min(rate, a.rate), min(burst, a.burst)
	}
	roomRate, roomBurst := n.shareRoom(l, a, now)
	if rate > a.rate {
		rate = max(a.rate, min(rate, roomRate))
	}
	if burst > a.burst {
		burst = max(a.burst, min(burst, roomBurst))
	}
	a.set(rate, burst, now)
}

// shareGrant is the answer to a's report.
func (n *Node) shareGrant(l *lease, a *shareAccount, now time.Time) LeaseGrant {
	return LeaseGrant{Epoch: a.epoch, Acked: a.admitted, Granted: a.admitted, TTL: n.leases.TTL, Share: true,
		ShareRateMilli: int64(math.Floor(a.rate * 1000)), ShareBurst: int64(a.burst)}
}

// expireShares frees the share accounts of l whose time-to-live ran out
// before now, and reports whether it freed any. sh.mu is held.
func (n *Node) expireShares(sh *shard, l *lease, now time.Time) bool {
	freed := false
	for lessee, a := range l.shares {
		if now.After(a.expires) && !now.Before(a.prevUntil) {
			delete(l.shares, lessee)
			sh.book.close(lessee)
			n.metrics.leaseExpired.Inc()
			freed = true
		}
	}
	return freed
}

// tenureWindow is how long a key must have been this node's for no other
// node's shares of it to be in force: a lease time-to-live after the last
// renewal another owner could have answered, the answer's delivery, and
// the sync round in which this node may not yet have seen the change.
func (n *Node) tenureWindow() time.Duration { return n.leases.TTL + ShareDelivery + n.interval }
