package algorithms

import "time"

// GCRA is the state of the generic cell rate algorithm (as in ATM traffic
// policing): cells are expected one emission interval I = Period/Count
// apart, and a cell may arrive early by up to the tolerance
// τ = (Capacity()-1)·I. Its state is a single instant, the theoretical
// arrival time (TAT) of the next cell. Its decisions equal TokenBucket's
// (its TAT is the bucket's Full instant); it is here for callers who think
// in GCRA terms and for its one-word state.
//
// The zero value has a TAT in the past: the stream is idle, a full burst
// conforms.
type GCRA struct {
	// TAT is the theoretical arrival time of the next cell, in Unix ns.
	TAT int64
	// TATFrac is the sub-nanosecond rest of TAT, in units of 1/Count ns,
	// 0 <= TATFrac < Count, which keeps a non-integral I exact.
	TATFrac int64
}

// Take admits n cells at time now if they conform, advancing the TAT by
// n·I, and reports the decision; a non-conforming request changes nothing.
//
// n cells conform when the last of them is no more than τ early:
// max(TAT, now) + (n-1)·I - τ <= now. As x/time/rate does, a request that
// is early by less than a nanosecond conforms; RetryAfter is how early it
// is, truncated to the nanosecond. Remaining is how many more cells would
// conform now, and ResetAfter the time until the TAT, rounded up.
func (g *GCRA) Take(now time.Time, l Limit, n int64) Decision {
	d, next := g.decide(now, l, n)
	if d.Allowed {
		*g = next
	}
	return d
}

// Check reports what Take would decide, without advancing the TAT.
func (g *GCRA) Check(now time.Time, l Limit, n int64) Decision {
	d, _ := g.decide(now, l, n)
	return d
}

// Merge keeps the later TAT of g and o: the later one has seen more cells,
// so a state arriving from another node never lets more cells conform.
func (g *GCRA) Merge(o GCRA) {
	if laterThan(o.TAT, o.TATFrac, g.TAT, g.TATFrac) {
		*g = o
	}
}

// decide returns Take's decision and the state Take would store. All spans
// are measured from now, in ticks of 1/Count ns.
func (g GCRA) decide(now time.Time, l Limit, n int64) (Decision, GCRA) {
	if !l.valid() || n < 0 {
		return refused(), g
	}
	r, t := l.ticks(), now.UnixNano()
	interval := u128{0, r.interval}    // I
	tau := r.capacity.sub(interval)    // τ = (B-1)·I
	tat := r.lead(g.TAT, g.TATFrac, t) // max(TAT, now) - now
	// r.status(tat) reports, for a TAT that far ahead, how many more cells
	// would conform (whole intervals in τ + I - tat) and when it is reached.
	if n > l.Capacity() {
		d := r.status(tat)
		d.RetryAfter = Never
		return d, g
	}
	next := tat.add(r.hits(n))
	// The last cell may arrive from TAT' - τ - I on; early is how far now
	// falls short of that, and must be under 1 ns.
	early := next.sub(tau.add(interval))
	if !early.less(r.oneNS()) {
		d := r.status(tat)
		d.RetryAfter = r.floor(early)
		return d, g
	}
	ns, frac, d, ok := r.admit(t, next)
	if !ok {
		d := r.status(tat)
		d.RetryAfter = Never
		return d, g
	}
	g.TAT, g.TATFrac = ns, frac
	return d, g
}
