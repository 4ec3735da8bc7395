package algorithms

import "time"

// TokenBucket is the state of a token bucket: Capacity() tokens, full at
// first, refilled continuously at Count per Period; a request for n hits is
// admitted when the bucket holds n tokens. Its decisions equal those of
// golang.org/x/time/rate with rate.Limit(Count/Period.Seconds()), burst
// Capacity() and AllowN (at non-decreasing times), so the two can be
// swapped; the one difference is that TokenBucket is exact where
// x/time/rate rounds in float64, which can tip a wait that lies within a
// rounding error of a whole nanosecond the other way.
//
// The state is the instant the bucket is full again, rather than a token
// count and a timestamp: one instant is exact (see Full and FullFrac), and
// taking the later of two such instants merges states from two nodes. The
// zero value is a full bucket.
type TokenBucket struct {
	// Full is the Unix ns at which the bucket is full again; any time
	// before now (such as 0) means it is full now.
	Full int64
	// FullFrac is the sub-nanosecond rest of the full instant, in units
	// of 1/Count ns, 0 <= FullFrac < Count. It is what keeps a refill
	// interval such as 1s/3 exact.
	FullFrac int64
}

// Take removes n tokens from b at time now if the bucket holds them, and
// reports the decision; a refused request changes nothing.
//
// Like x/time/rate, Take admits a request whose wait, truncated to a
// time.Duration, is 0: a shortfall worth less than a nanosecond of refill
// is lent, and repaid by the next refill. RetryAfter is that same truncated
// wait, so retrying after it is always admitted. Remaining is the whole
// number of tokens left, and ResetAfter the time until the bucket is full,
// rounded up to the nanosecond.
func (b *TokenBucket) Take(now time.Time, l Limit, n int64) Decision {
	d, next := b.decide(now, l, n)
	if d.Allowed {
		*b = next
	}
	return d
}

// Check reports what Take would decide, without taking any tokens.
func (b *TokenBucket) Check(now time.Time, l Limit, n int64) Decision {
	d, _ := b.decide(now, l, n)
	return d
}

// Merge keeps the emptier of b and o, the bucket full latest, so that a
// state arriving from another node never refills b.
func (b *TokenBucket) Merge(o TokenBucket) {
	if laterThan(o.Full, o.FullFrac, b.Full, b.FullFrac) {
		*b = o
	}
}

// decide returns Take's decision and the state Take would store.
func (b TokenBucket) decide(now time.Time, l Limit, n int64) (Decision, TokenBucket) {
	if !l.valid() || n < 0 {
		return refused(), b
	}
	r, t := l.ticks(), now.UnixNano()
	// missing is the refill the bucket lacks: tokens = capacity - missing.
	missing := r.lead(b.Full, b.FullFrac, t)
	if n > l.Capacity() {
		d := r.status(missing)
		d.RetryAfter = Never
		return d, b
	}
	after := missing.add(r.hits(n))
	// The wait is the refill still lacking once n tokens are taken:
	// after - capacity. It must truncate to 0 ns, that is be under 1 ns.
	if !after.less(r.capacity.add(r.oneNS())) {
		d := r.status(missing)
		d.RetryAfter = r.floor(after.sub(r.capacity))
		return d, b
	}
	ns, frac, d, ok := r.admit(t, after)
	if !ok {
		d := r.status(missing)
		d.RetryAfter = Never
		return d, b
	}
	b.Full, b.FullFrac = ns, frac
	return d, b
}
