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

// How a share becomes what Envoy's filter enforces.
//
// The owner lends each stream a rate share of the bucket's limit (see
// package global, shares.go): a rate r and a burst b. The assignment is a
// token bucket of max_tokens b refilled tokens_per_fill = r × fillInterval
// per fillInterval, a constant whole number of seconds: Envoy's filter
// counts the fill interval in whole seconds, and refills continuously at
// tokens_per_fill / fill_interval, so a long interval only makes the rate
// finer. The Envoy refills itself between reports, and a changed share
// starts its token bucket at the old one's level (scaled to the new size:
// global_client_impl.cc), so nothing is lost when a share moves. An
// unchanged share is sent unchanged, which Envoy takes as a renewal: it
// keeps its tokens and extends the time-to-live. With no share to lend the
// assignment is DENY_ALL.

// fillInterval is every token bucket's fill_interval.
const fillInterval = 60 * time.Second

// kind is how a bucket is served.
type kind uint8

const (
	leased      kind = iota // its policy's limit, shared among the streams by the key's owner
	allowAll                // no policy applies, or one that is unlimited or in shadow mode: ALLOW_ALL
	denyAll                 // a policy of requests_per_unit 0: DENY_ALL
	unsupported             // a policy that cannot be lent (min_interval_ms, a ceiling): no assignment
)

// bucket is one bucket_id of one stream. Only the stream's goroutine
// touches it.
type bucket struct {
	id   *rlqspb.BucketId
	key  string // its identity on the stream (bucketKey)
	kind kind
	item *pb.CheckItem // the share's counter and limit, when leased

	// The stream's account of the counter: admitted is the Envoy's
	// allowed requests, asked its allowed and denied ones, in all; the
	// share (rateMilli, burst) is the owner's last answer.
	epoch, admitted, asked int64
	rateMilli, burst       int64

	// cur is the assignment sent last, in force at the Envoy until
	// until (on this server's clock).
	cur   *typepb.RateLimitStrategy
	until time.Time
	// idle counts the Envoy's reports of the bucket in a row with no
	// request; reported is when it last reported it, interval the time
	// between its last two reports (its reporting interval).
	idle     int
	reported time.Time
	interval time.Duration
}

// sent reports whether b has an assignment sent.
func (b *bucket) sent() bool { return b.cur != nil }

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

// leaseReport is the stream's account of b, as the lease protocol reports
// a share: its totals, and the share it holds as a claim for an owner that
// did not answer it (a ring change).
func (b *bucket) leaseReport(release bool) *pb.LeaseReport {
	return &pb.LeaseReport{Item: b.item, Epoch: b.epoch, Admitted: b.admitted, Acked: b.admitted, Asked: b.asked,
		IntervalMs: b.interval.Milliseconds(), Share: true, ShareRateMilli: b.rateMilli, ShareBurst: b.burst, Release: release}
}

// assign adopts the owner's answer and returns the assignment to send,
// valid for ttl from now.
func (b *bucket) assign(g *pb.LeaseGrant, now time.Time, ttl time.Duration) *typepb.RateLimitStrategy {
	b.rateMilli, b.burst = g.GetShareRateMilli(), g.GetShareBurst()
	b.cur, b.until = shareStrategy(b.rateMilli, b.burst), now.Add(ttl)
	return b.cur
}

// shareStrategy is a share of rateMilli thousandths of a hit a second and
// burst as Envoy's RateLimitStrategy: a token bucket, rounded down, or
// DENY_ALL when it rounds to nothing.
func shareStrategy(rateMilli, burst int64) *typepb.RateLimitStrategy {
	perFill := min(rateMilli*int64(fillInterval/time.Second)/1000, math.MaxUint32)
	burst = min(burst, math.MaxUint32)
	if perFill < 1 || burst < 1 {
		return blanket(typepb.RateLimitStrategy_DENY_ALL)
	}
	return &typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_TokenBucket{TokenBucket: &typepb.TokenBucket{
		MaxTokens:     uint32(burst),
		TokensPerFill: wrapperspb.UInt32(uint32(perFill)),
		FillInterval:  durationpb.New(fillInterval),
	}}}
}

// blanket is a blanket rule.
func blanket(r typepb.RateLimitStrategy_BlanketRule) *typepb.RateLimitStrategy {
	return &typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

// Running totals stay within the lease protocol's bound: a stream adds at
// most MaxRequestsPerReport a report, and stops counting at
// global.MaxLeaseTotal (a bucket that lived that long is far past any
// limit's window).
func addTotal(total, n int64) int64 { return min(total+n, global.MaxLeaseTotal) }
