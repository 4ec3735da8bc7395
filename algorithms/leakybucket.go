package algorithms

import "time"

// LeakyBucket is the state of a leaky bucket used as a queue (a meter with
// a queue, as in traffic shaping): a queue of Capacity() hits drained at
// Count per Period. An admitted request joins the end of the queue and is
// told, in Decision.Delay, how long the queue ahead of it takes to drain;
// callers that wait that long proceed evenly spaced, one emission interval
// Period/Count apart, instead of in a burst. A request that does not fit in
// the queue is refused.
//
// The state is the instant the queue is empty (drained) again. The zero
// value is an empty queue.
type LeakyBucket struct {
	// Drained is the Unix ns at which the queue has drained; any time
	// before now (such as 0) means it is empty now.
	Drained int64
	// DrainedFrac is the sub-nanosecond rest of Drained, in units of
	// 1/Count ns, 0 <= DrainedFrac < Count.
	DrainedFrac int64
}

// Take queues n hits at time now if they fit, and reports the decision; a
// refused request changes nothing.
//
// Unlike TokenBucket, fitting is exact: there is no sub-nanosecond
// leniency, because the queue must never hold more than its capacity.
// Delay, RetryAfter and ResetAfter are rounded up to the nanosecond, so
// that waiting them is never too short: a caller that waits Delay starts at
// or after its slot, and a retry after RetryAfter fits. Remaining is how
// many more hits fit in the queue now.
func (q *LeakyBucket) Take(now time.Time, l Limit, n int64) Decision {
	d, next := q.decide(now, l, n)
	if d.Allowed {
		*q = next
	}
	return d
}

// Check reports what Take would decide, without queueing anything.
func (q *LeakyBucket) Check(now time.Time, l Limit, n int64) Decision {
	d, _ := q.decide(now, l, n)
	return d
}

// Merge keeps the longer queue of q and o, the one that drains latest, so
// that a state arriving from another node never empties q.
func (q *LeakyBucket) Merge(o LeakyBucket) {
	if laterThan(o.Drained, o.DrainedFrac, q.Drained, q.DrainedFrac) {
		*q = o
	}
}

// decide returns Take's decision and the state Take would store.
func (q LeakyBucket) decide(now time.Time, l Limit, n int64) (Decision, LeakyBucket) {
	if !l.valid() || n < 0 {
		return refused(), q
	}
	r, t := l.ticks(), now.UnixNano()
	ahead := r.lead(q.Drained, q.DrainedFrac, t) // time for the queue to drain
	if n > l.Capacity() {
		d := r.status(ahead)
		d.RetryAfter = Never
		return d, q
	}
	behind := ahead.add(r.hits(n)) // the queue once these hits join it
	if r.capacity.less(behind) {
		d := r.status(ahead)
		d.RetryAfter = r.ceil(behind.sub(r.capacity))
		return d, q
	}
	ns, frac, d, ok := r.admit(t, behind)
	if !ok {
		d := r.status(ahead)
		d.RetryAfter = Never
		return d, q
	}
	q.Drained, q.DrainedFrac = ns, frac
	d.Delay = r.ceil(ahead)
	return d, q
}
