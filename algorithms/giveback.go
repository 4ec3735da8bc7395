package algorithms

import "time"

// Give-back returns hits that a request took but did not use: a
// reservation settled for less than it held, or released. It is the
// inverse of Take, bounded so that giving back never refills a counter
// beyond what was taken, nor beyond what the hits could still be holding:
//
//   - The bucket algorithms (TokenBucket, GCRA, LeakyBucket) move their
//     one instant back by n emission intervals, but never before now: a
//     bucket is never made fuller than full, nor a queue shorter than
//     empty. Their charge is one instant whatever the time the hits were
//     taken at, so takenAt plays no part.
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
// already, so the caller gives nothing back then. An invalid l, or n <= 0,
// changes nothing.

// GiveBack returns n tokens to b at now, up to a full bucket.
func (b *TokenBucket) GiveBack(now, _ time.Time, l Limit, n int64) {
	if l.valid() && n > 0 {
		b.Full, b.FullFrac = l.ticks().back(b.Full, b.FullFrac, now.UnixNano(), n)
	}
}

// GiveBack moves g's TAT back by n emission intervals, to now at the
// earliest: the stream is then as idle as n fewer cells would have left it.
func (g *GCRA) GiveBack(now, _ time.Time, l Limit, n int64) {
	if l.valid() && n > 0 {
		g.TAT, g.TATFrac = l.ticks().back(g.TAT, g.TATFrac, now.UnixNano(), n)
	}
}

// GiveBack takes n hits out of q's queue at now, down to an empty queue.
// Requests already queued behind them were told their Delay and keep it:
// they wait longer than they now need to, the safe side; later requests
// get the shorter queue.
func (q *LeakyBucket) GiveBack(now, _ time.Time, l Limit, n int64) {
	if l.valid() && n > 0 {
		q.Drained, q.DrainedFrac = l.ticks().back(q.Drained, q.DrainedFrac, now.UnixNano(), n)
	}
}

// back returns the instant (ns, frac) moved n emission intervals earlier,
// but not before now: what is left of its lead over now less n hits. An
// instant already at or before now (a full bucket) stays as it is.
func (r rational) back(ns, frac, now int64, n int64) (int64, int64) {
	lead := r.lead(ns, frac, now)
	if lead.isZero() {
		return ns, frac
	}
	// lead is less than it: the quotient fits, and now+q <= ns.
	q, rem := lead.sub(r.hits(n)).div(r.perNS)
	return now + int64(q), int64(rem)
}

// GiveBack uncounts n hits counted at takenAt, if w still counts the
// window holding takenAt, down to an empty window.
func (w *FixedWindow) GiveBack(_, takenAt time.Time, l Limit, n int64) {
	if l.valid() && n > 0 && w.Count > 0 && windowStart(takenAt.UnixNano(), int64(l.Period)) == w.Start {
		w.Count -= min(n, w.Count)
	}
}

// GiveBack uncounts n hits counted at takenAt from the count of the window
// holding takenAt: the current count if it is w's current window, the
// previous count if it is the one before (where they still weigh in the
// estimate), else nowhere. w need not be rolled to now first: a current
// count that a later Take would make the previous one is that same
// window's.
func (w *SlidingWindow) GiveBack(_, takenAt time.Time, l Limit, n int64) {
	if !l.valid() || n <= 0 {
		return
	}
	period := int64(l.Period)
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
func (s *SlidingLog) GiveBack(_, takenAt time.Time, l Limit, n int64) {
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
