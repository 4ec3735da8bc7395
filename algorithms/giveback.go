package algorithms

import "time"

// Give-back returns hits that a request took but did not use: a
// reservation of taken hits settled for less than it held, or released.
// GiveBack(now, takenAt, l, taken, n) gives back n of the taken hits that
// a Take at takenAt admitted, bounded so that giving back never leaves a
// counter less charged than it would be had the Take been charged
// taken-n hits in the first place (TestGiveBackNeverUndercharges):
//
//   - The bucket algorithms (TokenBucket, GCRA, LeakyBucket) move their
//     one instant back by n emission intervals, but never before now, and
//     by no more of them than the taken hits still hold at now. A bucket
//     refills whoever took its tokens: as time passes, the taken hits
//     drain, the unused ones with the rest, and what has drained cannot be
//     given back again without refilling the bucket twice. Counting the
//     taken hits as draining from takenAt on (they drain no sooner), the
//     part still held at now is what lies after now of the span
//     [takenAt, takenAt + taken emission intervals]. So a settle at once
//     gives back exactly n; one a while later gives back less, or nothing
//     once the whole span has drained.
//   - FixedWindow uncounts n hits only from the window they were counted
//     in (the one holding takenAt): a window that has ended took its hits
//     with it.
//   - SlidingWindow uncounts them from the window holding takenAt when it
//     is the current or the previous one, and not once it has slid out.
//   - SlidingLog removes them from the entry logged at takenAt.
//
// Spacing has no give-back: it counts requests, not hits.
//
// takenAt must be the instant the hits were charged at: the now the Take
// that admitted them saw (for the store, the counter's evaluation time
// then, which never runs backwards). l must be the limit they were taken
// under: a state since clamped to another limit may have lost those hits
// already, so the caller gives nothing back then. n is at most taken (a
// larger n gives back taken); an invalid l, or n <= 0, changes nothing.

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
