package algorithms

import "time"

// SlidingWindow is the state of a sliding-window counter, the weighted
// two-window approximation of a sliding log: windows are aligned to
// multiples of Period since the Unix epoch, and the hits in the last Period
// are estimated as
//
//	previous·(1 - elapsed/Period) + current
//
// where elapsed is the time since the current window started. It smooths
// FixedWindow's edge bursts in three words of state. It ignores Burst.
//
// The zero value is an empty counter.
type SlidingWindow struct {
	// Start is the Unix ns at which the current window starts.
	Start int64
	// Prev is the number of hits admitted in the window before it.
	Prev int64
	// Curr is the number of hits admitted in the current window.
	Curr int64
	// Period is the window length in ns, as last set by Take. Merge needs
	// it to tell whether one state is exactly one window ahead of another.
	Period int64
}

// Take counts n hits at time now if the estimate plus n is at most Count,
// and reports the decision; a refused request changes nothing.
//
// The comparison is exact: previous·(Period-elapsed) + (current+n)·Period
// <= Count·Period, in 128-bit integers, so a boundary hit is decided the
// same way on every node. Remaining is the largest n that would be
// admitted now; RetryAfter the exact time until this request would be (at
// most the end of the next window), or Never if n > Count; ResetAfter the
// time until the estimate falls to zero.
func (w *SlidingWindow) Take(now time.Time, l Limit, n int64) Decision {
	d, next := w.decide(now, l, n)
	if d.Allowed {
		*w = next
	}
	return d
}

// Check reports what Take would decide, without counting anything.
func (w *SlidingWindow) Check(now time.Time, l Limit, n int64) Decision {
	d, _ := w.decide(now, l, n)
	return d
}

// Merge keeps the larger estimate of w and o at every future instant, so
// that a state arriving from another node never uncounts hits: for the same
// window it keeps the larger of each count; when one state is exactly one
// window ahead (by its Period), the other's current count is folded into
// its previous count; when it is further ahead, it is kept as it is.
func (w *SlidingWindow) Merge(o SlidingWindow) {
	if o.Start < w.Start {
		o, *w = *w, o
	}
	// Now w is the earlier (or same) window and o the later one.
	switch gap := o.Start - w.Start; {
	case gap == 0:
		*w = SlidingWindow{
			Start:  o.Start,
			Prev:   max(w.Prev, o.Prev),
			Curr:   max(w.Curr, o.Curr),
			Period: max(w.Period, o.Period),
		}
	case gap == o.Period || o.Period == 0:
		// Adjacent windows, or no Period to tell: folding is the safe side.
		o.Prev = max(o.Prev, w.Curr)
		*w = o
	default:
		*w = o
	}
}

// decide returns Take's decision and the state Take would store.
func (w SlidingWindow) decide(now time.Time, l Limit, n int64) (Decision, SlidingWindow) {
	if !l.valid() || n < 0 {
		return refused(), w
	}
	t, period := now.UnixNano(), int64(l.Period)
	w = w.roll(t, period)
	T := uint64(period)
	elapsed := uint64(max(t-w.Start, 0)) // < T after roll; 0 if now went back
	prev, curr := nonneg(w.Prev), nonneg(w.Curr)
	budget := mul(uint64(l.Count), T) // Count·T
	decay := mul(prev, T-elapsed)     // previous·(T-elapsed)
	// The largest total that fits: decay + total·T <= budget.
	fits, _ := budget.sub(decay).div(T)
	d := Decision{
		Remaining:  max(sat64(fits)-sat64(curr), 0),
		ResetAfter: w.resetAfter(T, elapsed, curr),
	}
	switch {
	case n > l.Count:
		d.RetryAfter = Never
	case n > d.Remaining:
		d.RetryAfter = w.retryAfter(uint64(l.Count), T, elapsed, prev, curr, uint64(n))
	default:
		d.Allowed = true
		w.Curr = sat64(curr + uint64(n))
		d.Remaining -= n
		d.ResetAfter = w.resetAfter(T, elapsed, uint64(w.Curr))
	}
	return d, w
}

// roll returns w moved to the window holding t: unchanged within the same
// window (or if t is before it), the current count becoming the previous
// one a window later, and empty after that.
func (w SlidingWindow) roll(t, period int64) SlidingWindow {
	switch {
	case t < w.Start:
		return w
	case w.Prev <= 0 && w.Curr <= 0 || t-w.Start >= satAdd(period, period):
		return SlidingWindow{Start: windowStart(t, period), Period: period}
	case t-w.Start >= period:
		return SlidingWindow{Start: windowStart(t, period), Prev: w.Curr, Period: period}
	}
	w.Period = period
	return w
}

// resetAfter returns the time until the estimate reaches zero: the end of
// the next window if the current one has hits, else the end of this one if
// the previous one had hits.
func (w SlidingWindow) resetAfter(T, elapsed, curr uint64) time.Duration {
	switch {
	case curr > 0:
		return time.Duration(sat64(2*T - elapsed)) // < 2^64 since T < 2^63
	case w.Prev > 0:
		return time.Duration(T - elapsed)
	}
	return 0
}

// retryAfter returns the time from now (elapsed into the window) until a
// refused request for n <= count hits would be admitted. The estimate only
// falls as time passes, so this is the first instant at which it fits:
// later in this window, as the previous count decays; else in the next
// window, as the current count decays in turn; else at its end.
func (w SlidingWindow) retryAfter(count, T, elapsed, prev, curr, n uint64) time.Duration {
	// In this window at elapsed e: prev·(T-e) <= (count-curr-n)·T.
	if curr+n <= count && prev > 0 {
		q, _ := mul(count-curr-n, T).div(prev)
		if q < T { // T-e <= q for e >= T-q, and e > elapsed as it is refused now
			return time.Duration(T - q - elapsed)
		}
	}
	// In the next window at elapsed e: curr·(T-e) <= (count-n)·T.
	e := uint64(0)
	if curr > 0 {
		q, _ := mul(count-n, T).div(curr)
		e = T - min(q, T)
	}
	return time.Duration(sat64(T - elapsed + e))
}
