// Package envoysim is a client of the rate limit quota service that
// behaves as Envoy's rate_limit_quota filter does (docs/envoy.md lists
// the behaviours), for tests and load runs: it decides each request from
// its bucket's assignment, in the process, and reports the usage every
// reporting interval on one stream.
//
//   - A bucket's first request is decided by the no-assignment behaviour,
//     and sends at once a report of that bucket alone: the subscription.
//   - Every interval, one message reports every bucket: the requests
//     allowed and denied since the last report, and time_elapsed in whole
//     seconds, as the filter sends it.
//   - A token bucket assignment that differs from the one in force (by
//     max_tokens, tokens_per_fill or fill_interval's nanoseconds) starts a
//     new, full bucket refilled at tokens_per_fill per whole seconds of
//     fill_interval; the same one keeps its bucket and extends its
//     time-to-live, which counts whole seconds from its arrival. A blanket
//     rule allows or denies all. AbandonAction forgets the bucket.
//   - An expired assignment (a zero time-to-live expires at once) falls
//     back to the expired behaviour, here the no-assignment one.
//   - A stream that ends is opened again at the next report.
package envoysim

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Config configures an Envoy.
type Config struct {
	// Conn is the connection to the quota service (a node's gRPC port,
	// or a balancer over several).
	Conn grpc.ClientConnInterface
	// Domain is the filter's domain.
	Domain string
	// Interval is the filter's reporting_interval.
	Interval time.Duration
	// AllowWithout: without an assignment (none yet, or expired) allow
	// every request; false denies them (no_assignment_behavior).
	AllowWithout bool
	// Now is the filter's clock; nil means time.Now.
	Now func() time.Time
}

// Envoy is one simulated Envoy: Allow decides, Run reports. It is safe
// for concurrent use.
type Envoy struct {
	conf Config

	mu      sync.Mutex
	buckets map[string]*bucket
	new     []*bucket // subscribed and not reported yet
	stream  rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	sent    bool // the stream carried a message: its domain
	// Assignments counts the assignments applied, Zero those with a zero
	// time-to-live, Abandoned the AbandonActions, Streams the streams
	// opened.
	assignments, zero, abandoned, streams int
}

type bucket struct {
	id              map[string]string
	allowed, denied uint64
	lastReport      time.Time
	// the assignment in force, nil when none
	action  *typepb.RateLimitStrategy
	expires time.Time
	tokens  float64
	rate    float64
	filled  time.Time
}

// New returns an Envoy. It starts nothing: Run does.
func New(conf Config) *Envoy {
	if conf.Now == nil {
		conf.Now = time.Now
	}
	return &Envoy{conf: conf, buckets: map[string]*bucket{}}
}

func keyOf(id map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(id)) {
		b.WriteString(k + "\x00" + id[k] + "\x00")
	}
	return b.String()
}

// Allow decides a request of the bucket id, as the filter does, and
// counts it for the next report.
func (e *Envoy) Allow(id map[string]string) bool {
	now := e.conf.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	k := keyOf(id)
	b := e.buckets[k]
	if b == nil {
		b = &bucket{id: maps.Clone(id), lastReport: now}
		e.buckets[k] = b
		e.new = append(e.new, b)
	}
	ok := b.decide(now, e.conf.AllowWithout)
	if ok {
		b.allowed++
	} else {
		b.denied++
	}
	return ok
}

func (b *bucket) decide(now time.Time, allowWithout bool) bool {
	if b.action != nil && !now.Before(b.expires) {
		b.action = nil
	}
	if b.action == nil {
		return allowWithout
	}
	switch s := b.action.GetStrategy().(type) {
	case *typepb.RateLimitStrategy_BlanketRule_:
		return s.BlanketRule == typepb.RateLimitStrategy_ALLOW_ALL
	case *typepb.RateLimitStrategy_TokenBucket:
		max := float64(s.TokenBucket.GetMaxTokens())
		b.tokens = min(max, b.tokens+b.rate*now.Sub(b.filled).Seconds())
		b.filled = now
		if b.tokens >= 1 {
			b.tokens--
			return true
		}
	}
	return false
}

// apply takes one bucket action.
func (e *Envoy) apply(a *rlqspb.RateLimitQuotaResponse_BucketAction, now time.Time) {
	b := e.buckets[keyOf(a.GetBucketId().GetBucket())]
	if b == nil {
		return // an action for a bucket it does not have: ignored, as the filter does
	}
	if a.GetAbandonAction() != nil {
		delete(e.buckets, keyOf(b.id))
		e.abandoned++
		return
	}
	q := a.GetQuotaAssignmentAction()
	if q == nil {
		return
	}
	if b.action != nil && !now.Before(b.expires) {
		b.action = nil // expired: the next assignment is a new one, whatever it says
	}
	e.assignments++
	s := q.GetRateLimitStrategy()
	if tb := s.GetTokenBucket(); tb != nil {
		old := b.action.GetTokenBucket()
		if b.action == nil || old == nil || old.GetMaxTokens() != tb.GetMaxTokens() ||
			old.GetTokensPerFill().GetValue() != tb.GetTokensPerFill().GetValue() || old.GetFillInterval().GetNanos() != tb.GetFillInterval().GetNanos() {
			b.tokens, b.filled = float64(tb.GetMaxTokens()), now
			if secs := tb.GetFillInterval().GetSeconds(); secs > 0 {
				b.rate = float64(tb.GetTokensPerFill().GetValue()) / float64(secs)
			} else {
				b.rate = 0
			}
		}
	}
	b.action = proto.Clone(s).(*typepb.RateLimitStrategy)
	ttl := time.Duration(q.GetAssignmentTimeToLive().GetSeconds()) * time.Second
	if ttl == 0 {
		e.zero++
	}
	b.expires = now.Add(ttl)
}

// Run opens the stream and reports every Interval until ctx ends,
// opening the stream again after it ends.
func (e *Envoy) Run(ctx context.Context) error {
	tick := time.NewTicker(e.conf.Interval)
	defer tick.Stop()
	sub := time.NewTicker(e.conf.Interval / 10) // subscriptions go out at once, as the filter's do
	defer sub.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sub.C:
			e.report(ctx, true)
		case <-tick.C:
			e.report(ctx, false)
		}
	}
}

// report sends the new buckets' reports (onlyNew) or every bucket's.
func (e *Envoy) report(ctx context.Context, onlyNew bool) {
	now := e.conf.Now()
	e.mu.Lock()
	var bs []*bucket
	if onlyNew {
		bs, e.new = e.new, nil
	} else {
		bs = slices.Collect(maps.Values(e.buckets))
		e.new = nil
	}
	if len(bs) == 0 {
		e.mu.Unlock()
		return
	}
	m := &rlqspb.RateLimitQuotaUsageReports{}
	for _, b := range bs {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqspb.BucketId{Bucket: b.id}, TimeElapsed: &durationpb.Duration{Seconds: int64(now.Sub(b.lastReport) / time.Second)},
			NumRequestsAllowed: b.allowed, NumRequestsDenied: b.denied})
		b.allowed, b.denied, b.lastReport = 0, 0, now
	}
	st := e.stream
	if st == nil {
		var err error
		st, err = rlqspb.NewRateLimitQuotaServiceClient(e.conf.Conn).StreamRateLimitQuotas(ctx)
		if err != nil {
			e.mu.Unlock()
			return // the usage is dropped, as the filter drops it
		}
		e.stream, e.sent = st, false
		e.streams++
		go e.receive(st)
	}
	if !e.sent {
		m.Domain = e.conf.Domain
	}
	e.sent = true
	e.mu.Unlock()
	if err := st.Send(m); err != nil {
		e.closed(st)
	}
}

// receive applies the stream's responses until it ends.
func (e *Envoy) receive(st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient) {
	for {
		resp, err := st.Recv()
		if err != nil {
			e.closed(st)
			return
		}
		now := e.conf.Now()
		e.mu.Lock()
		for _, a := range resp.GetBucketAction() {
			e.apply(a, now)
		}
		e.mu.Unlock()
	}
}

func (e *Envoy) closed(st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stream == st {
		e.stream = nil
	}
}

// Stats are counts of what an Envoy received.
type Stats struct {
	Assignments, ZeroTTL, Abandoned, Streams int
	// Tokens is the size of the token bucket assignment in force of
	// each bucket (0 without one).
	Tokens map[string]uint32
}

// Stats returns the counts so far.
func (e *Envoy) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := Stats{Assignments: e.assignments, ZeroTTL: e.zero, Abandoned: e.abandoned, Streams: e.streams, Tokens: map[string]uint32{}}
	for k, b := range e.buckets {
		s.Tokens[k] = b.action.GetTokenBucket().GetMaxTokens()
	}
	return s
}

// Endpoints is an Envoy cluster of several nodes, as the filter's
// grpc_service names one: a stream opens on the first that takes it, in
// order, as Envoy's balancer moves on from an endpoint that refuses.
type Endpoints []*grpc.ClientConn

// Invoke calls the first endpoint (the quota service has no unary call).
func (e Endpoints) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return e[0].Invoke(ctx, method, args, reply, opts...)
}

// NewStream opens the stream on the first endpoint that takes it.
func (e Endpoints) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	var err error
	for _, c := range e {
		var st grpc.ClientStream
		if st, err = c.NewStream(ctx, desc, method, opts...); err == nil {
			return st, nil
		}
	}
	return nil, err
}
