package envoysim

import (
	"math"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// Settings are a bucket's RateLimitQuotaBucketSettings, as far as they
// decide requests.
type Settings struct {
	// NoAssignment is no_assignment_behavior's fallback_rate_limit; nil
	// (unset) is ALLOW_ALL (filter.cc). A token bucket here makes Envoy
	// dereference a null limiter: Decide panics, as Envoy crashes.
	NoAssignment *typepb.RateLimitStrategy
	// Expired is expired_assignment_behavior's fallback_rate_limit, in
	// force for ExpiredTimeout (whole seconds) after an assignment
	// expires; nil means none, and the bucket goes back to NoAssignment
	// at once (global_client_impl.cc, onActionExpirationTimer).
	Expired        *typepb.RateLimitStrategy
	ExpiredTimeout time.Duration
}

// ErrNullLimiter is the panic of Decide with a token bucket in force
// without its limiter: Envoy's filter dereferences a null pointer there.
const ErrNullLimiter = "envoysim: a token bucket with no limiter: Envoy dereferences a null limiter and crashes (filter.cc, shouldAllowRequest)"

// Bucket is one bucket of Envoy's filter, on an explicit clock: the
// action in force and its token bucket. The zero value is a new bucket
// (its default action). It is not safe for concurrent use.
type Bucket struct {
	// action is the assignment or fallback in force; nil is the default
	// (Settings.NoAssignment).
	action *typepb.RateLimitStrategy
	// fallback says action is Settings.Expired, in force until expires;
	// otherwise until expires is the assignment's.
	fallback bool
	expires  time.Time
	limiter  *limiter // the token bucket of action, if it is one
}

// limiter is Envoy's AtomicTokenBucketImpl: its state is the time at
// which it was empty, so that it holds min(max, (now - empty) × rate).
type limiter struct {
	max, rate float64
	empty     time.Time
}

func newLimiter(max, rate, initial float64, now time.Time) *limiter {
	return &limiter{max: max, rate: rate, empty: now.Add(-ceilDuration(initial / rate))}
}

func (l *limiter) tokens(now time.Time) float64 {
	return max(0, min(l.max, now.Sub(l.empty).Seconds()*l.rate))
}

func (l *limiter) consume(now time.Time) bool {
	t := l.tokens(now)
	if t < 1 {
		return false
	}
	l.empty = now.Add(-ceilDuration((t - 1) / l.rate))
	return true
}

// ceilDuration is secs seconds, rounded up to the nanosecond, so that a
// level kept as a time is not a nanosecond's refill short of itself
// (Envoy keeps it as a double).
func ceilDuration(secs float64) time.Duration {
	return time.Duration(math.Ceil(secs * float64(time.Second)))
}

// Decide decides one request at now.
func (b *Bucket) Decide(s *Settings, now time.Time) bool {
	b.expire(s, now)
	strategy := b.action
	if strategy == nil {
		strategy = s.NoAssignment
		if strategy == nil {
			return true // no no_assignment_behavior: ALLOW_ALL (filter.cc)
		}
	}
	switch st := strategy.GetStrategy().(type) {
	case *typepb.RateLimitStrategy_BlanketRule_:
		return st.BlanketRule == typepb.RateLimitStrategy_ALLOW_ALL
	case *typepb.RateLimitStrategy_TokenBucket:
		if b.limiter == nil || b.action == nil {
			panic(ErrNullLimiter)
		}
		return b.limiter.consume(now)
	}
	return true // requests_per_time_unit, or no strategy: allowed (filter.cc)
}

// FirstAllowed is how the filter decides a bucket's first request, before
// the bucket exists: allowed unless no_assignment_behavior is a blanket
// DENY_ALL (filter.cc, noAssignmentBehaviorShouldAllow).
func (s *Settings) FirstAllowed() bool {
	return s.NoAssignment.GetBlanketRule() != typepb.RateLimitStrategy_DENY_ALL
}

// expire runs the expiry timers due by now (global_client_impl.cc,
// onActionExpirationTimer and onFallbackExpirationTimer).
func (b *Bucket) expire(s *Settings, now time.Time) {
	for b.action != nil && !now.Before(b.expires) {
		if b.fallback || s.Expired == nil {
			b.action, b.limiter, b.fallback = nil, nil, false
			continue
		}
		b.limiter = b.replace(s.Expired, now)
		b.action, b.fallback = s.Expired, true
		b.expires = b.expires.Add(s.ExpiredTimeout.Truncate(time.Second))
	}
}

// Apply takes one action of a response at now: an assignment for its
// time-to-live (whole seconds, from now), or an abandon, which it
// reports (the filter erases the bucket).
func (b *Bucket) Apply(s *Settings, a *rlqspb.RateLimitQuotaResponse_BucketAction, now time.Time) (abandoned bool) {
	b.expire(s, now)
	if a.GetAbandonAction() != nil {
		return true
	}
	q := a.GetQuotaAssignmentAction()
	strategy := q.GetRateLimitStrategy()
	switch strategy.GetStrategy().(type) {
	case *typepb.RateLimitStrategy_BlanketRule_:
		b.limiter = nil // a blanket rule's bucket carries no token bucket
	case *typepb.RateLimitStrategy_TokenBucket:
		b.limiter = b.replace(strategy, now)
	default:
		return false // requests_per_time_unit or none: the action is skipped
	}
	b.action, b.fallback = strategy, false
	b.expires = now.Add(time.Duration(q.GetAssignmentTimeToLive().GetSeconds()) * time.Second)
	b.expire(s, now) // a zero time-to-live expires at once
	return false
}

// replace is the limiter of token bucket strategy s at now: the one in
// force if s equals its assignment (max_tokens, tokens_per_fill and the
// nanoseconds of fill_interval), else a new one, refilled at
// tokens_per_fill per whole seconds of fill_interval and starting at the
// old limiter's level scaled to the new size, rounded down, or full
// without one (global_client_impl.cc, shouldReplaceTokenBucket and
// createTokenBucketFromAction).
func (b *Bucket) replace(s *typepb.RateLimitStrategy, now time.Time) *limiter {
	tb := s.GetTokenBucket()
	if old := b.action.GetTokenBucket(); old != nil && b.limiter != nil && old.GetMaxTokens() == tb.GetMaxTokens() &&
		old.GetTokensPerFill().GetValue() == tb.GetTokensPerFill().GetValue() && old.GetFillInterval().GetNanos() == tb.GetFillInterval().GetNanos() {
		return b.limiter
	}
	maxTokens := float64(tb.GetMaxTokens())
	rate := float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().AsDuration()/time.Second)
	rate = max(rate, 1.0/(365*24*3600)) // the token bucket's least fill rate (token_bucket_impl.cc)
	initial := maxTokens
	if b.limiter != nil {
		initial = math.Floor(maxTokens * b.limiter.tokens(now) / b.limiter.max)
	}
	return newLimiter(maxTokens, rate, initial, now)
}

// Tokens is the level of the token bucket in force at now, or -1 with
// none.
func (b *Bucket) Tokens(s *Settings, now time.Time) float64 {
	b.expire(s, now)
	if b.limiter == nil {
		return -1
	}
	return b.limiter.tokens(now)
}

// Strategy is the action in force at now: nil for the default.
func (b *Bucket) Strategy(s *Settings, now time.Time) *typepb.RateLimitStrategy {
	b.expire(s, now)
	return b.action
}
