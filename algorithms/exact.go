package algorithms

import (
	"math"
	"math/bits"
	"time"
)

// The bucket algorithms (TokenBucket, GCRA, LeakyBucket) move an instant
// forward by the emission interval Period/Count per hit. That interval is
// rarely a whole number of nanoseconds (1s/3 is 333333333⅓ ns), and
// rounding it would drift by up to a nanosecond per hit. So they measure
// spans in ticks of 1/Count ns: the emission interval is then exactly
// Period ticks, and a bucket's capacity exactly Burst·Period ticks. Such
// spans reach 2^127 for Count and Burst near 2^63, so they are u128 values.
// An instant is stored as Unix ns plus a remainder in ticks (0 <= frac <
// Count), which is what the exported ...Frac fields hold.

// u128 is an unsigned 128-bit integer: a span in ticks, or a product of two
// int64 quantities such as Count·Period that does not fit in 64 bits.
type u128 struct{ hi, lo uint64 }

// mul returns the full 128-bit product a·b.
func mul(a, b uint64) u128 {
	hi, lo := bits.Mul64(a, b)
	return u128{hi, lo}
}

// add returns a+b. Callers keep both below 2^127, so it cannot overflow.
func (a u128) add(b u128) u128 {
	lo, c := bits.Add64(a.lo, b.lo, 0)
	hi, _ := bits.Add64(a.hi, b.hi, c)
	return u128{hi, lo}
}

// sub returns a-b, or 0 if b > a: spans are never negative.
func (a u128) sub(b u128) u128 {
	if a.less(b) {
		return u128{}
	}
	lo, c := bits.Sub64(a.lo, b.lo, 0)
	hi, _ := bits.Sub64(a.hi, b.hi, c)
	return u128{hi, lo}
}

// less reports whether a < b.
func (a u128) less(b u128) bool {
	return a.hi < b.hi || a.hi == b.hi && a.lo < b.lo
}

// isZero reports whether a == 0.
func (a u128) isZero() bool { return a.hi == 0 && a.lo == 0 }

// div returns a/d and a%d. The quotient saturates at MaxUint64 (with
// remainder 0) instead of panicking as bits.Div64 would.
func (a u128) div(d uint64) (q, r uint64) {
	if a.hi >= d {
		return math.MaxUint64, 0
	}
	return bits.Div64(a.hi, a.lo, d)
}

// sat64 converts a count to int64, saturating at MaxInt64.
func sat64(q uint64) int64 {
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// nonneg converts a stored count to uint64, reading a negative (corrupt)
// value as 0.
func nonneg(x int64) uint64 {
	if x < 0 {
		return 0
	}
	return uint64(x)
}

// rational is a Limit's terms in ticks of 1/Count ns.
type rational struct {
	perNS    uint64 // ticks per nanosecond: Count
	interval uint64 // emission interval Period/Count ns, in ticks: Period
	capacity u128   // Capacity() emission intervals, in ticks
}

// ticks returns l's terms in ticks. l must be valid.
func (l Limit) ticks() rational {
	return rational{
		perNS:    uint64(l.Count),
		interval: uint64(l.Period),
		capacity: mul(uint64(l.Capacity()), uint64(l.Period)),
	}
}

// hits returns the span of n emission intervals.
func (r rational) hits(n int64) u128 { return mul(uint64(n), r.interval) }

// status returns the Remaining and ResetAfter of a bucket of r's capacity
// with span used of it taken (debt, TAT ahead of now, or queue): the whole
// emission intervals left, and the time until none is used, rounded up.
func (r rational) status(used u128) Decision {
	return Decision{
		Remaining:  r.cells(r.capacity.sub(used)),
		ResetAfter: r.ceil(used),
	}
}

// oneNS returns the span of one nanosecond.
func (r rational) oneNS() u128 { return u128{0, r.perNS} }

// cells returns how many whole emission intervals fit in span s.
func (r rational) cells(s u128) int64 {
	q, _ := s.div(r.interval)
	return sat64(q)
}

// lead returns how far the instant (ns, frac) lies after now, in ticks, or 0
// if it does not. A frac outside [0, Count), which a state written under
// another Count can hold, is clamped into it.
func (r rational) lead(ns, frac, now int64) u128 {
	if ns < now {
		return u128{}
	}
	frac = min(max(frac, 0), int64(r.perNS-1))
	// ns-now fits in uint64 even when the int64 subtraction would overflow.
	return mul(uint64(ns)-uint64(now), r.perNS).add(u128{0, uint64(frac)})
}

// admit returns the instant s ticks after now as (ns, frac), and the
// Decision of an admitted request that leaves s of the bucket used, with
// one division for both. It reports false if that instant is past the last
// one Unix ns can hold (in the year 2262): the bucket algorithms refuse such
// a request with RetryAfter Never, since storing a saturated instant
// instead would forget hits and over-admit.
func (r rational) admit(now int64, s u128) (ns, frac int64, d Decision, ok bool) {
	q, rem := s.div(r.perNS)
	if q > math.MaxInt64 || now+int64(q) < now {
		return 0, 0, Decision{}, false
	}
	reset := q
	if rem != 0 {
		reset++
	}
	d = Decision{Allowed: true, Remaining: r.cells(r.capacity.sub(s)), ResetAfter: time.Duration(sat64(reset))}
	return now + int64(q), int64(rem), d, true
}

// floor returns span s as a Duration truncated to the nanosecond,
// saturating at the largest Duration.
func (r rational) floor(s u128) time.Duration {
	q, _ := s.div(r.perNS)
	return time.Duration(sat64(q))
}

// ceil returns span s as a Duration rounded up to the nanosecond, so that
// waiting it always covers s; it saturates at the largest Duration.
func (r rational) ceil(s u128) time.Duration {
	q, rem := s.div(r.perNS)
	if rem != 0 && q < math.MaxInt64 {
		q++
	}
	return time.Duration(sat64(q))
}

// laterThan reports whether instant (ns, frac) is after (ons, ofrac); the
// bucket algorithms' Merge keeps the later of two such instants.
func laterThan(ns, frac, ons, ofrac int64) bool {
	return ns > ons || ns == ons && frac > ofrac
}

// windowStart returns the start of the Period-long window, aligned to the
// Unix epoch, that holds the instant t (Unix ns).
func windowStart(t int64, period int64) int64 {
	m := t % period
	if m < 0 {
		m += period
	}
	return t - m
}

// satAdd returns a+b for b >= 0, saturating at MaxInt64.
func satAdd(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}
