package algorithms

import "time"

// FixedWindow is the state of a fixed-window counter: time is cut into
// Period-long windows aligned to multiples of Period since the Unix epoch
// (whole minutes for a one-minute Period), and each window admits Count
// hits. It is the cheapest algorithm and easy to explain, at the price of
// admitting up to 2·Count hits across a window edge. It ignores Burst.
//
// The zero value is an empty window.
type FixedWindow struct {
	// Start is the Unix ns at which the counted window starts.
	Start int64
	// Count is the number of hits admitted in that window.
	Count int64
}

// Take counts n hits at time now if the window has room for them, and
// reports the decision; a refused request changes nothing.
//
// ResetAfter is the time until the window ends. RetryAfter, when refused,
// is also the time until the window ends, or Never if n > Count.
func (w *FixedWindow) Take(now time.Time, l Limit, n int64) Decision {
	d, next := w.decide(now, l, n)
	if d.Allowed {
		*w = next
	}
	return d
}

// Add counts n hits at time now whether or not the window has room for
// them, and reports them refused when the window's count after adding
// them exceeds l.Count. It is envoyproxy/ratelimit's fixed window, which
// counts refused requests too, so that a client that keeps knocking stays
// refused; Take is ringlimit's own, which never charges a refusal. An
// invalid l or a negative n is refused and counts nothing.
//
// A window that counted refused hits holds at most l.Count+1: every answer
// that rule gives (refused iff the count after adding exceeds l.Count,
// remaining max(0, l.Count - count)) depends only on the count capped
// there, so the cap changes no answer and keeps a window's count bounded,
// which is what lets Validate bound it.
func (w *FixedWindow) Add(now time.Time, l Limit, n int64) Decision {
	d, next := w.decide(now, l, n)
	if !l.valid() || n < 0 {
		return d
	}
	if !d.Allowed {
		next.Count = min(satAdd(next.Count, n), l.Count+1)
		d.Remaining = 0
	}
	*w = next
	return d
}

// Check reports what Take would decide, without counting anything.
func (w *FixedWindow) Check(now time.Time, l Limit, n int64) Decision {
	d, _ := w.decide(now, l, n)
	return d
}

// Merge keeps the more charged of w and o: the later window, or for the
// same window the larger count, so that a state arriving from another node
// never uncounts hits.
func (w *FixedWindow) Merge(o FixedWindow) {
	if o.Start > w.Start || o.Start == w.Start && o.Count > w.Count {
		*w = o
	}
}

// decide returns Take's decision and the state Take would store.
func (w FixedWindow) decide(now time.Time, l Limit, n int64) (Decision, FixedWindow) {
	if !l.valid() || n < 0 {
		return refused(), w
	}
	t, period := now.UnixNano(), int64(l.Period)
	// Roll to now's window when it is a later one (or w is empty); a now
	// before w.Start keeps w's window, as if no time had passed.
	if w.Count <= 0 || t >= satAdd(w.Start, period) {
		w = FixedWindow{Start: windowStart(t, period)}
	}
	left := time.Duration(satAdd(w.Start, period) - t)
	d := Decision{Remaining: max(l.Count-w.Count, 0), ResetAfter: left}
	switch {
	case n > l.Count:
		d.RetryAfter = Never
	case n > l.Count-w.Count:
		d.RetryAfter = left
	default:
		d.Allowed = true
		w.Count += n
		d.Remaining = l.Count - w.Count
	}
	return d, w
}
