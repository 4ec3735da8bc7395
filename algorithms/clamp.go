package algorithms

import "time"

// A counter's limit travels with each check, so the next check may bring
// another limit than the one its state was charged under (a changed limit,
// or a hostile one). Deciding it on the old state would let the old limit
// linger, so every state has a Clamp(now, l), applied before deciding
// whenever the limit differs: it lowers the state to the most charged one
// l allows at now. Afterwards the state passes Validate(now, l, 0); a
// state that passes already is unchanged; Clamp only uncounts, never
// allocates, and leaves the state unchanged for an invalid l. now is read
// as Unix ns, between 1970 and 2262. See docs/design-store.md, "A changed
// limit: Clamp".

// Clamp makes b owe no more than l allows at now: a bucket that lacks more
// than l's capacity of refill (it was charged under a larger burst or a
// slower rate) is made exactly empty, full again Capacity·Period/Count
// after now, to the tick. A FullFrac written under another Count is read
// as the decisions read it, clamped into [0, Count): less than a
// nanosecond either way.
func (b *TokenBucket) Clamp(now time.Time, l Limit) {
	b.Full, b.FullFrac = clampInstant(b.Full, b.FullFrac, now, l)
}

// Clamp is TokenBucket.Clamp for a GCRA's TAT: afterwards the TAT is at
// most Capacity emission intervals after now, as if a full burst had been
// sent under l just now.
func (g *GCRA) Clamp(now time.Time, l Limit) {
	g.TAT, g.TATFrac = clampInstant(g.TAT, g.TATFrac, now, l)
}

// Clamp is TokenBucket.Clamp for a leaky bucket's queue: afterwards it
// holds at most Capacity hits, which drain in Capacity·Period/Count.
func (q *LeakyBucket) Clamp(now time.Time, l Limit) {
	q.Drained, q.DrainedFrac = clampInstant(q.Drained, q.DrainedFrac, now, l)
}

// clampInstant returns the bucket instant (ns, frac) no later than a full
// drain under l after now, with frac in [0, Count) and ns not negative: a
// negative ns, like any instant before now, already means a bucket at
// rest, so it becomes the zero instant.
func clampInstant(ns, frac int64, now time.Time, l Limit) (int64, int64) {
	if !l.valid() {
		return ns, frac
	}
	if ns < 0 {
		return 0, 0
	}
	r, t := l.ticks(), now.UnixNano()
	frac = min(max(frac, 0), l.Count-1)
	if !r.capacity.less(r.lead(ns, frac, t)) {
		return ns, frac
	}
	// A lead above the capacity means t plus the capacity is before the
	// instant, so it fits in Unix ns and admit succeeds.
	if full, rest, _, ok := r.admit(t, r.capacity); ok {
		return full, rest
	}
	return ns, frac
}

// Clamp makes s wait no longer than l allows at now: a Next more than
// l.Period after now (set under a longer Period) becomes now+l.Period, as
// if a request had just been admitted under l, and a negative Next, which
// admits at once like any instant before now, becomes 0.
func (s *Spacing) Clamp(now time.Time, l Limit) {
	if !l.valid() {
		return
	}
	s.Next = min(max(s.Next, 0), satAdd(now.UnixNano(), int64(l.Period)))
}

// Clamp makes w count no more than l allows at now. A Count above l.Count
// becomes l.Count+1: the mark FixedWindow.Add leaves on a window that
// counted refused hits, which refuses every charged request until the
// window ends (as l.Count would) and tells a peek that the window is over
// its limit, which it is.
//
// A window of another period (its Start not a multiple of l.Period) moves
// to the window of l.Period that holds its Start, with its count: every
// hit it counted came at or after its Start, so if that window also holds
// now, it holds them all, and if it has ended, the next decision starts
// afresh. A Start after now (a clock ahead, merged from another node) moves
// to the window holding now.
func (w *FixedWindow) Clamp(now time.Time, l Limit) {
	if !l.valid() {
		return
	}
	w.Start = rehome(w.Start, now.UnixNano(), int64(l.Period))
	w.Count = min(max(w.Count, 0), satAdd(l.Count, 1))
}

// Clamp makes w count no more than l allows at now: Prev and Curr at most
// l.Count, the Period l's.
//
// A window whose Start is a multiple of l.Period keeps its counts as they
// are (capped), whatever period they were counted under; a window of
// another period moves, with its current count, to the window of l.Period
// that holds its Start, exactly as FixedWindow.Clamp moves it, and drops
// its previous count, whose hits may lie before that window. Both are
// approximations, as the algorithm is: a window knows how many hits it
// counted, not when in it they came.
func (w *SlidingWindow) Clamp(now time.Time, l Limit) {
	if !l.valid() {
		return
	}
	period := int64(l.Period)
	if start := rehome(w.Start, now.UnixNano(), period); start != w.Start {
		*w = SlidingWindow{Start: start, Curr: w.Curr, Period: w.Period}
	}
	w.Prev = min(max(w.Prev, 0), l.Count)
	w.Curr = min(max(w.Curr, 0), l.Count)
	if w.Period != 0 { // 0 is the zero value's, valid under any limit
		w.Period = period
	}
}

// rehome returns the start of the Period-long window that holds start, or
// now if start is after it, and is at least 0: start itself when it is a
// valid window start under period at now.
func rehome(start, now, period int64) int64 {
	return windowStart(max(min(start, now), 0), period)
}

// Clamp makes s hold no more than l allows at now: at most l.Count hits in
// the window (now-Period, now], keeping the newest and dropping the oldest
// excess (the oldest entry kept may lose part of its hits). If anything
// had to go, the entries that have left that window go too (no decision
// reads them), and hits logged after now (a clock ahead, merged from
// another node) are taken as logged now. A log already valid under l is
// unchanged, and so is any log under a Count above MaxSlidingLogLimit,
// which every decision refuses.
//
// Clamp may change the buffer s shares with its copies (see Clone).
func (s *SlidingLog) Clamp(now time.Time, l Limit) {
	t := now.UnixNano()
	if !s.usable(l, 0) || s.n == 0 {
		return
	}
	if i, _ := s.overfull(l); i < 0 && s.at(s.n-1).ts <= t {
		return
	}
	var later int64
	for s.n > 0 && s.at(s.n-1).ts >= t {
		later = satAdd(later, s.at(s.n-1).count)
		s.n--
	}
	if later > 0 {
		s.ring[s.index(s.n)] = logEntry{t, later}
		s.n++
	}
	// Keep, newest first, the hits in the window up to l.Count.
	budget, kept := l.Count, s.n
	for ; kept > 0 && budget > 0; kept-- {
		e := &s.ring[s.index(kept-1)]
		if e.ts <= t-int64(l.Period) {
			break
		}
		e.count = min(e.count, budget)
		budget -= e.count
	}
	s.head, s.n, s.hits = s.index(kept), s.n-kept, l.Count-budget
}
