package checks

import (
	"fmt"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
)

// Request validates item and converts it to the store's form, evaluated
// at now or at the item's created_at_ms when that is within maxSkew of
// now: earlier than now as it says, never later than now. Every check goes
// through it: a client's, one a peer forwards, relays or pulls, and a
// GLOBAL report's. An invalid item's error is a *FieldError naming the
// field. An item with min_interval_ms is a request with a MinInterval, or
// a spacing alone (limiter.Spacing) with neither limit nor duration_ms;
// a spacing is refused with GLOBAL and with charge_refused (see
// docs/design-store.md, "Minimum spacing is a counter beside the limit").
// An item that still names a policy is refused: the service resolves
// policies before it converts an item.
func Request(item *pb.CheckItem, now time.Time, maxSkew time.Duration) (limiter.Request, error) {
	alone := item.MinIntervalMs > 0 && item.Limit == 0 && item.DurationMs == 0
	switch {
	case item.Policy != "":
		return limiter.Request{}, &FieldError{"policy", "no --policy-file is loaded"}
	case item.Name == "":
		return limiter.Request{}, &FieldError{"name", "must not be empty"}
	case len(item.Name) > limiter.MaxNameLen:
		return limiter.Request{}, &FieldError{"name", fmt.Sprintf("longer than %d bytes", limiter.MaxNameLen)}
	case strings.IndexByte(item.Name, 0) >= 0:
		return limiter.Request{}, &FieldError{"name", "must not contain a NUL byte"}
	case item.Key == "":
		return limiter.Request{}, &FieldError{"key", "must not be empty"}
	case len(item.Key) > limiter.MaxKeyLen:
		return limiter.Request{}, &FieldError{"key", fmt.Sprintf("longer than %d bytes", limiter.MaxKeyLen)}
	case item.MinIntervalMs < 0 || item.MinIntervalMs > MaxDuration.Milliseconds():
		return limiter.Request{}, &FieldError{"min_interval_ms", fmt.Sprintf("must be between 0 (none) and %d, got %d", MaxDuration.Milliseconds(), item.MinIntervalMs)}
	case alone && item.Burst != 0:
		return limiter.Request{}, &FieldError{"burst", "must be omitted for a spacing alone (min_interval_ms without limit and duration_ms)"}
	case alone && item.Algorithm != pb.Algorithm_TOKEN_BUCKET:
		return limiter.Request{}, &FieldError{"algorithm", "must be omitted for a spacing alone (min_interval_ms without limit and duration_ms)"}
	case !alone && (item.Limit <= 0 || item.Limit > MaxLimit):
		return limiter.Request{}, &FieldError{"limit", fmt.Sprintf("must be between 1 and %d, got %d", MaxLimit, item.Limit)}
	case !alone && (item.DurationMs <= 0 || item.DurationMs > MaxDuration.Milliseconds()):
		return limiter.Request{}, &FieldError{"duration_ms", fmt.Sprintf("must be between 1 and %d, got %d", MaxDuration.Milliseconds(), item.DurationMs)}
	case item.Burst < 0 || item.Burst > MaxLimit:
		return limiter.Request{}, &FieldError{"burst", fmt.Sprintf("must be between 0 (= limit) and %d, got %d", MaxLimit, item.Burst)}
	case item.Hits != nil && (*item.Hits < 0 || *item.Hits > MaxLimit):
		return limiter.Request{}, &FieldError{"hits", fmt.Sprintf("must be between 0 and %d, got %d", MaxLimit, *item.Hits)}
	case item.Algorithm < 0 || !limiter.Algorithm(item.Algorithm).Public():
		return limiter.Request{}, &FieldError{"algorithm", fmt.Sprintf("unknown algorithm %d", item.Algorithm)}
	case item.Algorithm == pb.Algorithm_SLIDING_LOG && item.Limit > algorithms.MaxSlidingLogLimit:
		return limiter.Request{}, &FieldError{"limit", fmt.Sprintf("SLIDING_LOG keeps a timestamp per hit, so its limit is at most %d, got %d", algorithms.MaxSlidingLogLimit, item.Limit)}
	case item.Behavior < 0 || item.Behavior > pb.Behavior_LOCAL:
		return limiter.Request{}, &FieldError{"behavior", fmt.Sprintf("unknown behavior %d", item.Behavior)}
	case item.MinIntervalMs > 0 && item.Behavior == pb.Behavior_GLOBAL:
		return limiter.Request{}, &FieldError{"min_interval_ms", "not with GLOBAL behavior: a spacing is decided by the key's owner (use BATCHED or UNBATCHED)"}
	case item.ChargeRefused && (item.Algorithm != pb.Algorithm_FIXED_WINDOW || item.Behavior == pb.Behavior_GLOBAL || item.MinIntervalMs > 0 || item.Ceiling != 0):
		return limiter.Request{}, &FieldError{"charge_refused", "only for FIXED_WINDOW checks that are not GLOBAL and have neither min_interval_ms nor ceiling"}
	}
	if err := checkBorrowing(item, alone); err != nil {
		return limiter.Request{}, err
	}
	if item.ReserveTtlMs != nil {
		if err := checkReserve(item); err != nil {
			return limiter.Request{}, err
		}
	}
	at := now
	if item.CreatedAtMs != 0 {
		at = time.UnixMilli(item.CreatedAtMs)
		if skew := at.Sub(now).Abs(); skew > maxSkew {
			return limiter.Request{}, &FieldError{"created_at_ms", fmt.Sprintf("%v away from the server clock, more than --max-clock-skew %v", skew.Round(time.Millisecond), maxSkew)}
		}
		// A time ahead of this node's clock is taken as now, as a counter
		// received from a peer is (Intake): evaluated later, a spent
		// counter would regain what the difference refills (a bucket up
		// to --max-clock-skew of its rate, a window that begins later
		// with nothing counted), and the counter's time, which never runs
		// backwards, would then hold everyone else at that later time.
		if at.After(now) {
			at = now
		}
	}
	hits := int64(1)
	if item.Hits != nil {
		hits = *item.Hits
	}
	r := limiter.Request{
		Name:      item.Name,
		Key:       item.Key,
		Algorithm: limiter.Algorithm(item.Algorithm), // the enums' values are equal (TestAlgorithmEnumMatches)
		Limit: algorithms.Limit{
			Count:  item.Limit,
			Period: time.Duration(item.DurationMs) * time.Millisecond,
			Burst:  item.Burst,
		},
		Hits:          hits,
		Reset:         item.Reset_,
		ChargeRefused: item.ChargeRefused,
		MinInterval:   time.Duration(item.MinIntervalMs) * time.Millisecond,
		Now:           at,
	}
	if alone {
		r.Algorithm, r.Limit, r.MinInterval = limiter.Spacing, limiter.SpacingLimit(r.MinInterval), 0
	}
	return r, nil
}

// checkBorrowing checks item's ceiling and parent: both or neither, a
// ceiling above the limit and within the public bounds, and a parent
// within a check's own bounds; not with GLOBAL, whose answers come from
// grants without the key's owner, nor on a spacing alone, which has no
// limit to borrow beyond. (charge_refused is refused by Request; a
// ceiling in an all-or-nothing request by the service, which sees the
// request.)
func checkBorrowing(item *pb.CheckItem, alone bool) error {
	p := item.GetParent()
	switch {
	case item.Ceiling == 0 && p == nil:
		return nil
	case item.Ceiling == 0:
		return &FieldError{"ceiling", "missing: parent is for a check that borrows up to a ceiling"}
	case p == nil:
		return &FieldError{"parent", "missing: a ceiling borrows from a parent limit"}
	case alone:
		return &FieldError{"ceiling", "not on a spacing alone (min_interval_ms without limit): it has no limit to borrow beyond"}
	case item.Ceiling <= item.Limit || item.Ceiling > MaxLimit:
		return &FieldError{"ceiling", fmt.Sprintf("must be above limit (%d) and at most %d, got %d", item.Limit, MaxLimit, item.Ceiling)}
	case item.Algorithm == pb.Algorithm_SLIDING_LOG && item.Ceiling > algorithms.MaxSlidingLogLimit:
		return &FieldError{"ceiling", fmt.Sprintf("SLIDING_LOG keeps a timestamp per hit, so its ceiling is at most %d, got %d", algorithms.MaxSlidingLogLimit, item.Ceiling)}
	case item.Behavior == pb.Behavior_GLOBAL:
		return &FieldError{"ceiling", "not with GLOBAL behavior: borrowing is decided by the key's owner (use BATCHED, UNBATCHED or LOCAL)"}
	case p.Key == "":
		return &FieldError{"parent.key", "must not be empty"}
	case len(p.Key) > MaxParentKeyLen:
		return &FieldError{"parent.key", fmt.Sprintf("longer than %d bytes", MaxParentKeyLen)}
	case p.Limit <= 0 || p.Limit > MaxLimit:
		return &FieldError{"parent.limit", fmt.Sprintf("must be between 1 and %d, got %d", MaxLimit, p.Limit)}
	case item.Algorithm == pb.Algorithm_SLIDING_LOG && p.Limit > algorithms.MaxSlidingLogLimit:
		return &FieldError{"parent.limit", fmt.Sprintf("SLIDING_LOG keeps a timestamp per hit, so its limit is at most %d, got %d", algorithms.MaxSlidingLogLimit, p.Limit)}
	case p.DurationMs < 0 || p.DurationMs > MaxDuration.Milliseconds():
		return &FieldError{"parent.duration_ms", fmt.Sprintf("must be between 0 (the check's duration_ms) and %d, got %d", MaxDuration.Milliseconds(), p.DurationMs)}
	}
	return nil
}
