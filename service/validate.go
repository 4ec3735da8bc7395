package service

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
)

// The bounds a check must respect. They keep one request's cost and one
// counter's memory bounded whatever a client sends.
const (
	// MaxItems is the most items one request may carry.
	MaxItems = 1000
	// MaxNameLen and MaxKeyLen bound the bytes of a limit's name and key.
	MaxNameLen = 256
	MaxKeyLen  = 1024
	// MaxLimit bounds limit, burst and hits.
	MaxLimit = 1_000_000_000
	// MaxDuration bounds duration_ms: a year.
	MaxDuration = 365 * 24 * time.Hour
)

// ErrInvalid is wrapped by every validation error, so the API can map them
// all to one code.
var ErrInvalid = errors.New("invalid argument")

// ErrTooManyItems reports a request with more than MaxItems items.
var ErrTooManyItems = fmt.Errorf("requests: more than %d items: %w", MaxItems, ErrInvalid)

// FieldError reports an invalid field of a check item, named as on the wire.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Unwrap makes every FieldError match ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// toRequest validates item and converts it to the store's form, evaluated
// at now or at the item's created_at_ms when that is within maxSkew of now.
//
// An item with min_interval_ms is a request with a MinInterval, which the
// store decides together with the spacing of its name and key; one with
// min_interval_ms and neither limit nor duration_ms is a spacing alone, a
// request of kind limiter.Spacing, which takes no burst nor algorithm. A
// spacing is refused with GLOBAL: GLOBAL answers from each node's grant,
// without asking the owner, so no node could tell how long ago another
// admitted a request; and with charge_refused, which would charge a
// refused request.
func toRequest(item *pb.CheckItem, now time.Time, maxSkew time.Duration) (limiter.Request, error) {
	alone := item.MinIntervalMs > 0 && item.Limit == 0 && item.DurationMs == 0
	switch {
	case item.Policy != "": // Service.withPolicy resolved it, if it could
		return limiter.Request{}, &FieldError{"policy", "no --policy-file is loaded"}
	case item.Name == "":
		return limiter.Request{}, &FieldError{"name", "must not be empty"}
	case len(item.Name) > MaxNameLen:
		return limiter.Request{}, &FieldError{"name", fmt.Sprintf("longer than %d bytes", MaxNameLen)}
	case strings.IndexByte(item.Name, 0) >= 0:
		return limiter.Request{}, &FieldError{"name", "must not contain a NUL byte"}
	case item.Key == "":
		return limiter.Request{}, &FieldError{"key", "must not be empty"}
	case len(item.Key) > MaxKeyLen:
		return limiter.Request{}, &FieldError{"key", fmt.Sprintf("longer than %d bytes", MaxKeyLen)}
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
	at := now
	if item.CreatedAtMs != 0 {
		at = time.UnixMilli(item.CreatedAtMs)
		if skew := at.Sub(now).Abs(); skew > maxSkew {
			return limiter.Request{}, &FieldError{"created_at_ms", fmt.Sprintf("%v away from the server clock, more than --max-clock-skew %v", skew.Round(time.Millisecond), maxSkew)}
		}
	}
	hits := int64(1)
	if item.Hits != nil {
		hits = *item.Hits
	}
	r := limiter.Request{
		Name:      item.Name,
		Key:       item.Key,
		Algorithm: limiter.Algorithm(item.Algorithm),
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

// validateCounter checks a handed-off counter's identity and limit with
// toRequest, the public API's checks, so that hand-off admits no counter
// a check could not have made (a limit over MaxLimit, a period that is not
// whole milliseconds or longer than MaxDuration, a sliding log over its
// bound, a spacing of another limit than one request per period).
func (s *Service) validateCounter(c *limiter.Counter) error {
	if c.Limit.Period%time.Millisecond != 0 {
		return &FieldError{"duration_ms", fmt.Sprintf("period %v is not whole milliseconds", c.Limit.Period)}
	}
	item := &pb.CheckItem{
		Name: c.Name, Key: c.Key, Algorithm: pb.Algorithm(c.Algorithm),
		Limit: c.Limit.Count, DurationMs: c.Limit.Period.Milliseconds(), Burst: c.Limit.Burst,
	}
	if c.Algorithm == limiter.Spacing {
		if c.Limit != limiter.SpacingLimit(c.Limit.Period) {
			return &FieldError{"min_interval_ms", fmt.Sprintf("a spacing counter's limit is one request per period, got %+v", c.Limit)}
		}
		item = &pb.CheckItem{Name: c.Name, Key: c.Key, MinIntervalMs: c.Limit.Period.Milliseconds()}
	}
	_, err := toRequest(item, s.now(), s.skew)
	return err
}
