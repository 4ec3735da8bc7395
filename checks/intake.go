package checks

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
)

// Intake takes counters that arrive from outside the node into a store, as
// strictly as Request takes a check: hand-off (handoff.Node.Receive),
// replication (package replica) and a snapshot loaded at start (package
// snapshot) all take counters through it. The zero value allows no clock
// skew.
type Intake struct {
	// MaxClockSkew bounds how far past this node's clock a received
	// counter's times may lie.
	MaxClockSkew time.Duration
}

// Merger is what Intake merges into: a *limiter.Store.
type Merger interface {
	Merge(c limiter.Counter, now time.Time, skew time.Duration) error
}

// Merge decodes each record, validates it (ValidateCounter, then
// untilNow's bounds on time, then the store's own checks of its state)
// and merges it into m at now. It returns a Refusal, naming the record by
// its index, for each it did not take: UNKNOWN_VERSION for a record or
// state of a version this build does not know, INVALID for one that does
// not decode or is impossible, UNAVAILABLE otherwise. A refused record
// changes nothing.
func (in Intake) Merge(m Merger, records []*peerpb.CounterState, now time.Time) []*peerpb.Refusal {
	var refused []*peerpb.Refusal
	for i, cs := range records {
		var c limiter.Counter
		err := c.UnmarshalBinary(cs.GetCounter())
		if err == nil {
			if verr := ValidateCounter(&c); verr != nil {
				err = fmt.Errorf("counter %s/%s: %w: %w", c.Name, c.Key, limiter.ErrBadCounter, verr)
			}
		}
		if err == nil {
			c, skew, uerr := in.untilNow(c, now)
			err = uerr
			if err == nil {
				err = m.Merge(c, now, skew)
			}
		}
		if err != nil {
			r := &peerpb.Refusal{Index: int32(i), Reason: peerpb.Refusal_UNAVAILABLE, Detail: err.Error()}
			switch {
			case errors.Is(err, limiter.ErrUnknownVersion):
				r.Reason = peerpb.Refusal_UNKNOWN_VERSION
			case errors.Is(err, limiter.ErrBadCounter):
				r.Reason = peerpb.Refusal_INVALID
			}
			refused = append(refused, r)
		}
	}
	return refused
}

// untilNow returns c, a counter from another node received at now, and
// the clock skew to merge it with. A peer cannot move a counter past this
// node's clock: read later, a bucket would refill by the difference, and
// a window that begins later would replace the current one and its count,
// at every hand-off. So c's last evaluation, refused if it is more than
// the skew ahead, is taken as now at the latest; and a window (fixed or
// sliding) must have begun by now (no skew allowed), else Merge refuses it
// and it stays with its sender, which offers it again later. Other states
// keep the allowed skew.
func (in Intake) untilNow(c limiter.Counter, now time.Time) (limiter.Counter, time.Duration, error) {
	if ahead := time.Duration(c.Last - now.UnixNano()); ahead > in.MaxClockSkew {
		return c, 0, fmt.Errorf("counter %s/%s: last evaluated %v after now, more than the clock skew %v: %w", c.Name, c.Key, ahead, in.MaxClockSkew, limiter.ErrBadCounter)
	}
	c.Last = min(c.Last, now.UnixNano())
	if err := in.reservations(&c, now); err != nil {
		return c, 0, err
	}
	skew := in.MaxClockSkew
	if c.Algorithm == limiter.FixedWindow || c.Algorithm == limiter.SlidingWindow {
		skew = 0
	}
	return c, skew, nil
}

// reservations checks the bounds of c's reservations that a check's
// bounds set: a settled cost of at most MaxLimit, as Settlement takes it,
// and an expiry at most MaxReserveTTL past now plus the clock skew, so that
// no reservation arrives to be held longer than one could be made for.
// The store checks the rest when it merges c.
func (in Intake) reservations(c *limiter.Counter, now time.Time) error {
	latest := now.Add(in.MaxClockSkew + MaxReserveTTL).UnixNano()
	for i := range c.Reservations {
		r := &c.Reservations[i]
		switch {
		case r.Cost < 0 || r.Cost > MaxLimit:
			return fmt.Errorf("counter %s/%s: reservation %s: cost %d outside 0..%d: %w", c.Name, c.Key, r.ID, r.Cost, MaxLimit, limiter.ErrBadCounter)
		case r.Expires > latest:
			return fmt.Errorf("counter %s/%s: reservation %s: expires %v after now, more than reserve_ttl_ms allows (%v) plus the clock skew %v: %w",
				c.Name, c.Key, r.ID, time.Duration(r.Expires-now.UnixNano()), MaxReserveTTL, in.MaxClockSkew, limiter.ErrBadCounter)
		}
	}
	return nil
}

// ReasonLabel is a refusal reason as a metric label, e.g. "invalid".
func ReasonLabel(r peerpb.Refusal_Reason) string { return strings.ToLower(r.String()) }

// ValidateCounter checks a counter's identity and limit with Request, as
// a check's, so that no counter is taken in that a check could not have
// made (a limit over MaxLimit, a period that is not whole milliseconds or
// longer than MaxDuration, a sliding log over its bound, a spacing of
// another limit than one request per period), nor a reservation whose
// limit a check could not have reserved under. The store checks its state
// when it merges it.
func ValidateCounter(c *limiter.Counter) error {
	if err := validateLimit(c, c.Limit); err != nil {
		return err
	}
	for i := range c.Reservations {
		if err := validateLimit(c, c.Reservations[i].Limit); err != nil {
			return fmt.Errorf("reservation %s: %w", c.Reservations[i].ID, err)
		}
	}
	return nil
}

// validateLimit checks l, c's limit or one of its reservations', as a
// check of c's name, key and algorithm would.
func validateLimit(c *limiter.Counter, l algorithms.Limit) error {
	if l.Period%time.Millisecond != 0 {
		return &FieldError{"duration_ms", fmt.Sprintf("period %v is not whole milliseconds", l.Period)}
	}
	item := &pb.CheckItem{
		Name: c.Name, Key: c.Key, Algorithm: pb.Algorithm(c.Algorithm),
		Limit: l.Count, DurationMs: l.Period.Milliseconds(), Burst: l.Burst,
	}
	if c.Algorithm == limiter.Spacing {
		if l != limiter.SpacingLimit(l.Period) {
			return &FieldError{"min_interval_ms", fmt.Sprintf("a spacing counter's limit is one request per period, got %+v", l)}
		}
		item = &pb.CheckItem{Name: c.Name, Key: c.Key, MinIntervalMs: l.Period.Milliseconds()}
	}
	_, err := Request(item, time.Time{}, 0) // no created_at_ms: the clock plays no part
	return err
}
