package rlqs

import (
	"math"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// How a grant becomes what Envoy's filter enforces.
//
// Envoy runs one token bucket a bucket_id, made from the assignment's
// TokenBucket when the assignment differs from the one in force (a new
// bucket starts full: max_tokens), kept with its tokens when the
// assignment is the same (only its time-to-live is extended), and
// dropped when the assignment expires. So an assignment here is an
// *instance*: a token bucket of `tokens` hits, sent once with a fill
// interval whose nanoseconds carry the instance's number (Envoy's filter
// compares them to tell a new assignment from a renewal, and counts the
// rate in whole seconds), then renewed unchanged. Its refill is
// tokens per fillWindow, slow enough to be small and fast enough that
// Envoy's bucket starts full (it refuses to pre-fill a bucket whose
// max_tokens/rate exceeds its monotonic clock).
//
// The server keeps, per bucket, cap: the most the Envoy can have admitted
// from every instance sent, each through its expiry (its tokens and its
// refill), counting instances replaced as spent in full. It sends or
// renews an instance only while cap stays within the grant the owner
// reserves for the stream (granted): so the Envoy admits at most what the
// owner lent, exactly, as a Go lessee does. A new instance is sent only
// when the current one is nearly spent by the Envoy's reports (at most an
// eighth of it and one hit left), or cannot be renewed within the grant;
// the hits it still held are then counted spent (a stranded reserve, small
// while the Envoy spends what it gets). With nothing to lend, the
// assignment is DENY_ALL.

// fillWindow is the time an instance takes to refill its size.
const fillWindow = 60 * time.Second

// deliveryMargin is added to an instance's time-to-live when its refill
// is counted: Envoy starts the time-to-live when it receives the
// assignment, after the server sent it.
const deliveryMargin = time.Second

// kind is how a bucket is served.
type kind uint8

const (
	leased      kind = iota // its policy's limit, lent to the stream by the key's owner
	allowAll                // no policy applies, or one that is unlimited or in shadow mode: ALLOW_ALL
	denyAll                 // a policy of requests_per_unit 0: DENY_ALL
	unsupported             // a policy that cannot be lent (min_interval_ms, a ceiling): no assignment
)

// bucket is one bucket_id of one stream. Only the stream's goroutine
// touches it.
type bucket struct {
	id   *rlqspb.BucketId
	kind kind
	item *pb.CheckItem // the lease's counter and limit, when leased

	// The stream's account of the counter, in the lease protocol's
	// running totals: admitted is the Envoy's allowed requests, asked its
	// allowed and denied ones; granted and acked are the owner's last
	// answer.
	epoch, admitted, asked, acked, granted int64

	// The assignment in force (see above). tokens 0 is DENY_ALL; prior
	// is cap without the current instance.
	prior         float64
	tokens        int64
	seq           int64
	since, until  time.Time
	sent, expired bool
	// idle counts the Envoy's reports of the bucket in a row with no
	// request; reported is when it last reported it.
	idle     int
	reported time.Time
	// leasedAt is when the owner last answered the stream's account.
	leasedAt time.Time
}

// report adds one usage report of the Envoy.
func (b *bucket) report(u usage, now time.Time) {
	b.admitted = addTotal(b.admitted, u.allowed)
	b.asked = addTotal(b.asked, u.allowed+u.denied)
	if u.allowed+u.denied == 0 {
		b.idle++
	} else {
		b.idle = 0
	}
	b.reported = now
}

// instanceCap is what the current instance lets the Envoy admit in all,
// through time t.
func (b *bucket) instanceCap(t time.Time) float64 {
	if b.tokens == 0 {
		return 0
	}
	refill := float64(b.tokens) * max(0, t.Add(deliveryMargin).Sub(b.since).Seconds()) / fillWindow.Seconds()
	return float64(b.tokens) + refill
}

// cap is the most the Envoy can have admitted from every instance sent,
// through their expiries.
func (b *bucket) cap() float64 { return b.prior + b.instanceCap(b.until) }

// leaseReport is the stream's account of b, as the lease protocol reports
// it: granted claims what the Envoy may hold, which an owner that did not
// lend the account (a new one, a ring change) reserves as far as it can,
// and any other owner ignores.
func (b *bucket) leaseReport(interval time.Duration) *pb.LeaseReport {
	c := min(int64(math.Ceil(b.cap())), math.MaxInt64/2)
	return &pb.LeaseReport{Item: b.item, Epoch: b.epoch, Admitted: b.admitted, Acked: b.acked, Asked: b.asked,
		Granted: max(b.granted, c, b.admitted), IntervalMs: interval.Milliseconds()}
}

// assign adopts the owner's answer (granted total, acked) and returns
// the assignment to send, valid for ttl from now, or nil when the one
// in force stands: the same instance, renewed, is still returned, since
// a renewal is what extends its time-to-live.
func (b *bucket) assign(granted, acked int64, now time.Time, ttl time.Duration) *typepb.RateLimitStrategy {
	b.granted, b.acked = granted, max(b.acked, acked)
	if b.sent && !now.Before(b.until) {
		// Envoy may have dropped the instance at its expiry (it counts
		// from when it received it), and would start the same one again
		// full: only a new instance is safe.
		b.expired = true
	}
	if over := float64(b.admitted) - b.cap(); over > 0 {
		// Hits the Envoy admitted outside any instance (its own
		// no-assignment or expired behaviour, or more than it was
		// lent): the cap never lies below what it reported.
		b.prior += over
	}
	g := float64(granted)
	until := now.Add(ttl)
	if b.tokens > 0 {
		left := b.prior + b.instanceCap(now) - float64(b.admitted)
		spent := left < 1+float64(b.tokens)/8
		if !spent && !b.expired && b.prior+b.instanceCap(until) <= g {
			b.until = until
			return b.strategy()
		}
		b.prior = b.cap() // the instance it replaces, counted spent in full
	}
	per := 1 + (ttl+deliveryMargin).Seconds()/fillWindow.Seconds()
	m := int64(math.Floor((g - b.prior) / per))
	m = min(m, math.MaxUint32)
	if m < 1 {
		m = 0
	}
	b.seq++
	b.tokens, b.since, b.until, b.sent, b.expired = m, now, until, true, false
	return b.strategy()
}

// strategy is the current instance as Envoy's RateLimitStrategy.
func (b *bucket) strategy() *typepb.RateLimitStrategy {
	if b.tokens == 0 {
		return blanket(typepb.RateLimitStrategy_DENY_ALL)
	}
	return &typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_TokenBucket{TokenBucket: &typepb.TokenBucket{
		MaxTokens:     uint32(b.tokens),
		TokensPerFill: wrapperspb.UInt32(uint32(b.tokens)),
		FillInterval:  &durationpb.Duration{Seconds: int64(fillWindow.Seconds()), Nanos: int32(b.seq%999_999_999) + 1},
	}}}
}

// blanket is a blanket rule.
func blanket(r typepb.RateLimitStrategy_BlanketRule) *typepb.RateLimitStrategy {
	return &typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}
