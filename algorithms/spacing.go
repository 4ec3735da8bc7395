package algorithms

import (
	"math"
	"time"
)

// Spacing is the state of a minimum spacing between requests: a request is
// admitted only if at least l.Period has passed since the last admitted
// one. It counts requests, not hits: any n > 0 is one request (n == 0 is a
// peek). It reads only l.Period of its Limit. It decides exactly as a GCRA
// of one cell per Period and no burst tolerance, with Next its TAT, but is
// a kind of its own, so that it never meets a user's GCRA counter of the
// same name and key, and its state is one word (see docs/design-store.md,
// "Minimum spacing is a counter beside the limit").
//
// The zero value has never admitted a request: the next one is admitted.
type Spacing struct {
	// Next is the Unix ns from which the next request is admitted: the
	// last admitted request's time plus the Period it was admitted under.
	// Any instant up to now (such as 0) admits now.
	Next int64
}

// Take admits a request at time now if its spacing allows it, moving Next
// to now+Period, and reports the decision; a refused request changes
// nothing. RetryAfter of a refusal is exactly Next-now: at Next the request
// is admitted, a nanosecond before it is not. Remaining is 1 when a
// request would be admitted now (after this one), else 0; ResetAfter is
// the time until Next.
func (s *Spacing) Take(now time.Time, l Limit, n int64) Decision {
	d, next := s.decide(now, l, n)
	if d.Allowed {
		s.Next = next
	}
	return d
}

// Check reports what Take would decide, without moving Next.
func (s *Spacing) Check(now time.Time, l Limit, n int64) Decision {
	d, _ := s.decide(now, l, n)
	return d
}

// Merge keeps the later Next of s and o: the later one has seen a later
// admitted request, so a state arriving from another node never admits a
// request sooner.
func (s *Spacing) Merge(o Spacing) {
	s.Next = max(s.Next, o.Next)
}

// decide returns Take's decision and the Next that Take would store.
func (s Spacing) decide(now time.Time, l Limit, n int64) (Decision, int64) {
	if !l.valid() || n < 0 {
		return refused(), s.Next
	}
	t := now.UnixNano()
	var wait time.Duration
	if s.Next > t {
		wait = time.Duration(s.Next - t) // both are >= 0 here, so this cannot overflow
	}
	switch {
	case wait > 0 && n == 0:
		return Decision{Allowed: true, ResetAfter: wait}, s.Next
	case wait > 0:
		return Decision{RetryAfter: wait, ResetAfter: wait}, s.Next
	case n == 0:
		return Decision{Allowed: true, Remaining: 1}, s.Next
	case t > math.MaxInt64-int64(l.Period):
		// Next would lie past 2262: refuse rather than saturate, which
		// would admit again sooner than Period.
		return Decision{Remaining: 1, RetryAfter: Never}, s.Next
	}
	return Decision{Allowed: true, ResetAfter: l.Period}, t + int64(l.Period)
}
