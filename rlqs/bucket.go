package rlqs

import (
	"math"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/global"
	"github.com/ringlimit/ringlimit/lease"
)

// How a grant becomes what Envoy's filter enforces.
//
// Envoy runs one token bucket a bucket_id, made from the assignment's
// TokenBucket when the assignment differs from the one in force (a new
// bucket starts full: max_tokens), kept with its tokens when the
// assignment is the same (only its time-to-live is extended), and
// dropped when the assignment expires. So an assignment here is an
// *instance*: a token bucket of M tokens, sent once with a fill interval
// whose nanoseconds carry the instance's number (Envoy's filter compares
// them to tell a new assignment from a renewal, and counts the rate in
// whole seconds), then renewed unchanged. It refills M per fillWindow:
// slow, and fast enough that Envoy's bucket starts full (it refuses to
// pre-fill a bucket whose max_tokens/rate exceeds its monotonic clock).
//
// The server bounds what the Envoy can still admit beyond what it
// reported (admitted): a token bucket holds at most its size, so each
// instance that may be in force at the Envoy (until its expiry and
// deliveryMargin) can admit at most its size plus its refill until then,
// counted from deliveryMargin before now (the Envoy's usage is counted
// when it sent its report); one replaced is in force until the one sent
// in its place arrives. admitted plus those terms (need) is kept
// within the grant the owner reserves for the stream (granted): an
// instance is renewed, or a new one sent, only if need stays within it.
// So the Envoy admits at most what the owner lent, as a Go lessee does,
// given that an assignment reaches the Envoy within deliveryMargin and a
// report reaches the server within deliveryMargin of the Envoy counting
// it; need holds no hit once the instances that were replaced are dead,
// so nothing stays reserved for an instance spent. A new instance is sent
// when the Envoy's reports show the current one spent (all but an eighth
// of it and one hit), or it cannot be renewed within the grant; with
// nothing to lend, the assignment is DENY_ALL.

// fillWindow is the time an instance takes to refill its size.
const fillWindow = 60 * time.Second

// deliveryMargin bounds the time an assignment takes to reach Envoy, and
// a report to reach the server (see above): the stream's messages cross
// a connection that is up, in well under it.
const deliveryMargin = 250 * time.Millisecond

// maxReplaced bounds the replaced instances a bucket keeps the terms of:
// with more in force at once, the current one is renewed, not replaced.
const maxReplaced = 8

// instance is one token bucket assignment sent to the Envoy.
type instance struct {
	tokens       int64     // M; 0 is DENY_ALL
	since, until time.Time // sent; expires (Envoy's clock starts when it arrives)
	admitted     int64     // the bucket's admitted total when sent
	replaced     time.Time // when another was sent in its place, if it was
}

// term is the most inst can admit, beyond what the Envoy had reported at
// t, through until (its expiry).
func (inst *instance) term(t, until time.Time) float64 {
	if inst.tokens == 0 {
		return 0
	}
	from := t.Add(-deliveryMargin)
	refill := float64(inst.tokens) * max(0, until.Add(deliveryMargin).Sub(from).Seconds()) / fillWindow.Seconds()
	return float64(inst.tokens) + refill
}

// dead reports whether inst was no longer in force at the Envoy when the
// report read at t was counted: it ends at its expiry, or when the
// instance sent in its place arrives, whichever is first.
func (inst *instance) dead(t time.Time) bool {
	end := inst.until
	if !inst.replaced.IsZero() && inst.replaced.Before(end) {
		end = inst.replaced
	}
	return t.Add(-deliveryMargin).After(end.Add(deliveryMargin))
}

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

	// The assignment in force, and those it replaced that may still be
	// (see above).
	cur      instance
	replaced []instance
	seq      int64
	sent     bool
	// idle counts the Envoy's reports of the bucket in a row with no
	// request; reported is when it last reported it, interval the time
	// between its last two reports (its reporting_interval).
	idle     int
	reported time.Time
	interval time.Duration
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
	if !b.reported.IsZero() {
		b.interval = min(now.Sub(b.reported), lease.MaxIntervalMs*time.Millisecond)
	}
	b.reported = now
}

// need is admitted plus the most the Envoy can still admit at t, with
// the current instance in force through until.
func (b *bucket) need(t, until time.Time) float64 {
	n := float64(b.admitted) + b.cur.term(t, until)
	live := b.replaced[:0]
	for _, r := range b.replaced {
		if !r.dead(t) {
			live = append(live, r)
			n += r.term(t, r.until)
		}
	}
	clear(b.replaced[len(live):])
	b.replaced = live
	return n
}

// leaseReport is the stream's account of b, as the lease protocol reports
// it: granted claims what the Envoy may hold, which an owner that did not
// lend the account (a new one, a ring change) reserves as far as it can,
// and any other owner ignores.
func (b *bucket) leaseReport(now time.Time) *pb.LeaseReport {
	c := min(int64(math.Ceil(b.need(now, b.cur.until))), global.MaxLeaseTotal)
	return &pb.LeaseReport{Item: b.item, Epoch: b.epoch, Admitted: b.admitted, Acked: b.acked, Asked: b.asked,
		Granted: max(b.granted, c), IntervalMs: b.interval.Milliseconds()}
}

// assign adopts the owner's answer (granted total, acked) and returns
// the assignment to send, valid for ttl from now: the instance in force,
// renewed, or a new one.
func (b *bucket) assign(granted, acked int64, now time.Time, ttl time.Duration) *typepb.RateLimitStrategy {
	b.granted, b.acked = granted, max(b.acked, acked)
	g := float64(granted)
	until := now.Add(ttl)
	// Envoy may have dropped an instance at its expiry (counted from when
	// it arrived) before a renewal reaches it, and would start the same
	// one again full: only a new instance is safe then.
	live := b.sent && now.Add(deliveryMargin).Before(b.cur.until)
	if live && b.cur.tokens > 0 {
		spent := float64(b.admitted-b.cur.admitted) >= float64(b.cur.tokens)*7/8-1
		if (!spent || len(b.replaced) >= maxReplaced) && b.need(now, until) <= g {
			b.cur.until = until
			return b.strategy()
		}
	}
	if live && b.cur.tokens == 0 && len(b.replaced) >= maxReplaced {
		b.cur.until = until // DENY_ALL renewed
		return b.strategy()
	}
	if b.sent && b.cur.tokens > 0 {
		r := b.cur
		r.replaced = now
		b.replaced = append(b.replaced, r)
	}
	b.cur = instance{}
	per := 1 + (ttl+3*deliveryMargin).Seconds()/fillWindow.Seconds()
	m := int64(math.Floor((g - b.need(now, until)) / per))
	m = min(max(m, 0), math.MaxUint32)
	b.seq++
	b.cur = instance{tokens: m, since: now, until: until, admitted: b.admitted}
	b.sent = true
	return b.strategy()
}

// strategy is the current instance as Envoy's RateLimitStrategy.
func (b *bucket) strategy() *typepb.RateLimitStrategy {
	if b.cur.tokens == 0 {
		return blanket(typepb.RateLimitStrategy_DENY_ALL)
	}
	m := uint32(b.cur.tokens)
	return &typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_TokenBucket{TokenBucket: &typepb.TokenBucket{
		MaxTokens:     m,
		TokensPerFill: wrapperspb.UInt32(m),
		FillInterval:  &durationpb.Duration{Seconds: int64(fillWindow.Seconds()), Nanos: int32(b.seq%999_999_999) + 1},
	}}}
}

// blanket is a blanket rule.
func blanket(r typepb.RateLimitStrategy_BlanketRule) *typepb.RateLimitStrategy {
	return &typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}
