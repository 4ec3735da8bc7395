// Package algorithms holds ringlimit's six rate-limit algorithms as pure
// functions over small state structs.
//
// Every algorithm has the same shape: a state struct whose zero value is a
// counter at rest (full bucket, empty window), and methods that take an
// explicit now, a Limit and a number of hits:
//
//	Take(now, l, n) Decision   // decide, and charge only if admitted
//	Check(now, l, n) Decision  // what Take would answer, changing nothing
//	Merge(other)               // keep the more-charged of two states
//
// Nothing here reads a clock, locks, logs or allocates on the decision path:
// the caller (the limiter store) owns locking and time.Now. State is kept in
// integer nanoseconds and exact integer (128-bit where needed) arithmetic,
// so decisions at window edges are exact and repeatable.
package algorithms

import (
	"errors"
	"time"
)

// Never is the RetryAfter of a request that can never be admitted, because
// it asks for more hits than the counter's capacity.
const Never time.Duration = -1

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
