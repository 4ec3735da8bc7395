// Package algorithms holds ringlimit's six rate-limit algorithms, and
// Spacing (a minimum time between requests), as pure functions over small
// state structs, each with the same shape:
//
//	Take(now, l, n) Decision   // decide, and charge only if admitted
//	Check(now, l, n) Decision  // what Take would answer, changing nothing
//	Merge(other)               // keep the more-charged of two states
//	Clamp(now, l)              // follow a changed limit: uncount what l cannot hold
//
// Nothing here reads a clock, locks, logs or allocates on the decision
// path: the caller owns locking and time.Now, and states are exact integer
// nanoseconds. The contract all share (n == 0 a peek, a refusal changes
// nothing, a clock that goes backwards can refuse but never over-admit)
// is in docs/design-store.md, "The algorithms' contract", their binary
// forms in CODEC.md. No state is safe for concurrent use: the caller locks.
package algorithms

import (
	"errors"
	"fmt"
	"time"
)

// Never is the RetryAfter of a request that can never be admitted, because
// it asks for more hits than the counter's capacity.
const Never time.Duration = -1

// LongerWait returns the longer of two RetryAfters, Never being the
// longest: how long until both of two counters admit.
func LongerWait(a, b time.Duration) time.Duration {
	if a == Never || b == Never {
		return Never
	}
	return max(a, b)
}

// ShorterWait returns the shorter of two RetryAfters, Never being the
// longest: how long until either of two counters admits.
func ShorterWait(a, b time.Duration) time.Duration {
	switch {
	case a == Never:
		return b
	case b == Never:
		return a
	}
	return min(a, b)
}

// ErrInvalidLimit reports a Limit that no algorithm can apply.
var ErrInvalidLimit = errors.New("invalid limit")

// Limit is what a counter allows: Count hits per Period, with Burst hits
// admitted at once from rest by the bucket algorithms. A Burst of 0 means
// Count. Window and log algorithms ignore Burst.
type Limit struct {
	Count  int64
	Period time.Duration
	Burst  int64
}

// Validate returns an error wrapping ErrInvalidLimit if l has a
// non-positive Count or Period or a negative Burst, so that the caller can
// reject a bad request once, at the edge, instead of per decision.
func (l Limit) Validate() error {
	switch {
	case l.Count <= 0:
		return fmt.Errorf("count %d is not positive: %w", l.Count, ErrInvalidLimit)
	case l.Period <= 0:
		return fmt.Errorf("period %v is not positive: %w", l.Period, ErrInvalidLimit)
	case l.Burst < 0:
		return fmt.Errorf("burst %d is negative: %w", l.Burst, ErrInvalidLimit)
	}
	return nil
}

// valid is Validate without building an error, for the decision path.
func (l Limit) valid() bool {
	return l.Count > 0 && l.Period > 0 && l.Burst >= 0
}

// refused returns the Decision for a request that no amount of waiting
// admits: an invalid Limit or a negative n. (A function, not a variable,
// so that no package state can be changed.)
func refused() Decision { return Decision{RetryAfter: Never} }

// Capacity is the number of hits a counter at rest admits at once: Burst,
// or Count when Burst is 0.
func (l Limit) Capacity() int64 {
	if l.Burst > 0 {
		return l.Burst
	}
	return l.Count
}

// Decision is an algorithm's answer to one request.
type Decision struct {
	// Allowed reports whether the hits were admitted (and charged).
	Allowed bool
	// Remaining is the whole number of hits that could still be admitted
	// right now, after this request.
	Remaining int64
	// RetryAfter is, for a refused request, how long until the same request
	// would be admitted; Never if it asks for more than the capacity; 0 when
	// admitted.
	RetryAfter time.Duration
	// ResetAfter is how long from now until the counter is back to full.
	ResetAfter time.Duration
	// Delay is, for LeakyBucket only, how long the caller should wait before
	// proceeding so that admitted requests are evenly spaced.
	Delay time.Duration
}
