package checks

import (
	"fmt"
	"strings"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
)

// MaxReserveTTL bounds a reservation's time-to-live (reserve_ttl_ms): a
// day. Work that runs longer settles in parts. Together with
// --max-reservations it bounds what reservations hold.
const MaxReserveTTL = 24 * time.Hour

// DefaultMaxReserveTTL bounds the time-to-live a client's check may ask
// for (reserve_ttl_ms) unless it names a policy whose reserve_ttl_ms is
// longer (up to MaxReserveTTL): an hour, so that a client's reservations
// hold a node's table for a day only where a policy says they may.
const DefaultMaxReserveTTL = time.Hour

// MaxClientReserveTTL returns the longest time-to-live a client's check
// may reserve for: DefaultMaxReserveTTL, or policyTTL, the reserve_ttl_ms
// of the policy it names (0: none), if that is longer.
func MaxClientReserveTTL(policyTTL time.Duration) time.Duration {
	return max(DefaultMaxReserveTTL, policyTTL)
}

// CheckClientReserveTTL checks item's reserve_ttl_ms, if any, against
// MaxClientReserveTTL(policyTTL); checkReserve has checked it against
// MaxReserveTTL, the bound of every reservation, a forwarded one's too.
func CheckClientReserveTTL(item *pb.CheckItem, policyTTL time.Duration) error {
	if most := MaxClientReserveTTL(policyTTL); item.GetReserveTtlMs() > most.Milliseconds() {
		return &FieldError{"reserve_ttl_ms", fmt.Sprintf("at most %d (%v) for this check, got %d: a longer reservation needs a policy whose reserve_ttl_ms allows it",
			most.Milliseconds(), most, item.GetReserveTtlMs())}
	}
	return nil
}

// checkReserve checks the reservation of item, which has reserve_ttl_ms:
// a time-to-live within bounds, at least one hit, and nothing a
// reservation cannot give back exactly or that is not decided by the
// key's owner, who holds the reservation (see limiter.Store.Reserve).
func checkReserve(item *pb.CheckItem) error {
	ttl := item.GetReserveTtlMs()
	switch {
	case ttl <= 0 || ttl > MaxReserveTTL.Milliseconds():
		return &FieldError{"reserve_ttl_ms", fmt.Sprintf("must be between 1 and %d (a day), got %d", MaxReserveTTL.Milliseconds(), ttl)}
	case item.Hits != nil && *item.Hits == 0:
		return &FieldError{"hits", "a reservation holds at least 1 hit, got 0"}
	case item.Behavior == pb.Behavior_GLOBAL || item.Behavior == pb.Behavior_LOCAL:
		return &FieldError{"behavior", fmt.Sprintf("not with %s: a reservation is held by the key's owner (use BATCHED or UNBATCHED)", item.Behavior)}
	case item.Ceiling != 0:
		return &FieldError{"ceiling", "not with reserve_ttl_ms: a check that borrows cannot reserve yet"}
	case item.MinIntervalMs > 0: // a spacing alone too
		return &FieldError{"min_interval_ms", "not with reserve_ttl_ms: a spacing counts requests and cannot give them back"}
	case item.ChargeRefused:
		return &FieldError{"charge_refused", "not with reserve_ttl_ms: a reservation holds only admitted hits"}
	case !limiter.Reservable(limiter.Algorithm(item.Algorithm)):
		return &FieldError{"algorithm", fmt.Sprintf("%s cannot give hits back, so it cannot reserve", item.Algorithm)}
	}
	return nil
}

// ReserveTTL returns the time-to-live of an item's reservation, 0 if it
// reserves nothing. Request has checked it.
func ReserveTTL(item *pb.CheckItem) time.Duration {
	return time.Duration(item.GetReserveTtlMs()) * time.Millisecond
}

// Settlement validates a settle and converts it to the store's form,
// evaluated at now. A missing cost is a release. An invalid field's
// error is a *FieldError naming it.
func Settlement(req *pb.SettleRequest, now time.Time) (limiter.Settlement, error) {
	id, err := limiter.ParseReservationID(req.GetReservationId())
	switch {
	case err != nil:
		return limiter.Settlement{}, &FieldError{"reservation_id", strings.TrimPrefix(err.Error(), "reservation_id: ")}
	case req.GetName() == "" || len(req.GetName()) > limiter.MaxNameLen:
		return limiter.Settlement{}, &FieldError{"name", fmt.Sprintf("must be 1 to %d bytes, the reservation's name", limiter.MaxNameLen)}
	case req.GetKey() == "" || len(req.GetKey()) > limiter.MaxKeyLen:
		return limiter.Settlement{}, &FieldError{"key", fmt.Sprintf("must be 1 to %d bytes, the reservation's key", limiter.MaxKeyLen)}
	case req.Cost != nil && (*req.Cost < 0 || *req.Cost > MaxLimit):
		return limiter.Settlement{}, &FieldError{"cost", fmt.Sprintf("must be between 0 and %d, got %d (omit it to release)", MaxLimit, *req.Cost)}
	}
	return limiter.Settlement{
		ID: id, Name: req.GetName(), Key: req.GetKey(),
		Cost: req.GetCost(), Release: req.Cost == nil, Now: now,
	}, nil
}
