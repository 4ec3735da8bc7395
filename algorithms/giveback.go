package algorithms

import "time"

// Give-back returns hits that a request took but did not use (a
// reservation settled for less, or released). GiveBack(now, takenAt, l,
// taken, n) gives back n of the taken hits that a Take at takenAt
// admitted, bounded so that it never leaves a counter less charged than a
// Take of taken-n would have (TestGiveBackNeverUndercharges): the buckets
// move their instant back by no more than the taken hits still hold at
// now; the windows and the log uncount them only from the window or entry
// they were counted in, while it lasts. Spacing has none. takenAt must be
// the instant the hits were charged at, and l the limit they were taken
// under; n is at most taken; an invalid l, or n <= 0, changes nothing. See
// docs/design-store.md, "Give-back".

// GiveBack returns to b at now n of the taken tokens taken at takenAt,
// as many as have not refilled yet, up to a full bucket.
func (b *TokenBucket) GiveBack(now, takenAt time.Time, l Limit, taken, n int64) {
	if l.valid() && n > 0 {
		b.Full, b.FullFrac = l.ticks().back(b.Full, b.FullFrac, now.UnixNano(), takenAt.UnixNano(), taken, n)
	}
}

// GiveBack moves g's TAT back by n of the taken cells that arrived at
// takenAt, as many as are still ahead of now, to now at the earliest: the
// stream is then as idle as n fewer cells would have left it.
func (g *GCRA) GiveBack(now, takenAt time.Time, l Limit, taken, n int64) {
	if l.valid() && n > 0 {
		g.TAT, g.TATFrac = l.ticks().back(g.TAT, g.TATFrac, now.UnixNano(), takenAt.UnixNano(), taken, n)
	}
}

// GiveBack takes out of q's queue at now n of the taken hits queued at
// takenAt, as many as have not drained yet, down to an empty queue.
// Requests already queued behind them were told their Delay and keep it:
// they wait longer than they now need to, the safe side; later requests
// get the shorter queue.
func (q *LeakyBucket) GiveBack(now, takenAt time.Time, l Limit, taken, n int64) {
	if l.valid() && n > 0 {
		q.Drained, q.DrainedFrac = l.ticks().back(q.Drained, q.DrainedFrac, now.UnixNano(), takenAt.UnixNano(), taken, n)
	}
}

// back returns the instant (ns, frac) moved earlier by n emission
// intervals of the taken ones taken at takenAt, or by as many of those as
// lie after now when counted from takenAt on, whichever is less, and not
// before now. An instant already at or before now (a full bucket) stays
// as it is.
func (r rational) back(ns, frac, now, takenAt int64, taken, n int64) (int64, int64) {
	lead := r.lead(ns, frac, now)
	if lead.isZero() {
		return ns, frac
	}
	give := r.hits(min(n, max(taken, 0)))
	// The taken hits' span, from takenAt on, less what has drained by now.
	held := r.hits(max(taken, 0)).sub(mul(uint64(max(now-takenAt, 0)), r.perNS))
	if held.less(give) {
		give = held
	}
	// lead is less than it: the quotient fits, and now+q <= ns.
	q, rem := lead.sub(give).div(r.perNS)
	return now + int64(q), int64(rem)
}

// GiveBack uncounts n hits counted at takenAt, if w still counts the
// window holding takenAt, down to an empty window.
func (w *FixedWindow) GiveBack(_, takenAt time.Time, l Limit, taken, n int64) {
	if l.valid() && n > 0 && w.Count > 0 && windowStart(takenAt.UnixNano(), int64(l.Period)) == w.Start {
		w.Count -= min(n, taken, w.Count)
	}
}

// GiveBack uncounts n hits counted at takenAt from the count of the window
// holding takenAt: the current count if it is w's current window, the
// previous count if it is the one before (where they still weigh in the
// estimate), else nowhere. w need not be rolled to now first: a current
// count that a later Take would make the previous one is that same
// window's.
func (w *SlidingWindow) GiveBack(_, takenAt time.Time, l Limit, taken, n int64) {
	if !l.valid() || n <= 0 {
		return
	}
	period, n := int64(l.Period), min(n, taken)
	switch windowStart(takenAt.UnixNano(), period) {
	case w.Start:
		w.Curr -= min(n, max(w.Curr, 0))
	case w.Start - period:
		w.Prev -= min(n, max(w.Prev, 0))
	}
}

// GiveBack removes n hits from the entry s logged at takenAt, dropping the
// entry if none are left in it. Hits logged at another instant are not
// the ones taken at takenAt, so they are never removed; an entry that has
// left the window, or was dropped, has nothing left to give back.
func (s *SlidingLog) GiveBack(_, takenAt time.Time, l Limit, taken, n int64) {
	n = min(n, taken)
	if !s.usable(l, n) || n == 0 {
		return
	}
	ts := takenAt.UnixNano()
	for i := range s.n {
		e := &s.ring[s.index(i)]
		if e.ts > ts {
			return
		}
		if e.ts < ts {
			continue
		}
		given := min(n, e.count)
		e.count -= given
		s.hits -= given
		if e.count == 0 {
			for k := i; k < s.n-1; k++ {
				s.ring[s.index(k)] = s.at(k + 1)
			}
			s.n--
		}
		return
	}
}
