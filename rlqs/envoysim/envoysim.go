// Package envoysim is a client of the rate limit quota service that does
// what Envoy's rate_limit_quota filter does, as its source reads
// (source/extensions/filters/http/rate_limit_quota/ and
// source/common/common/token_bucket_impl.cc, mid-2026), for tests and
// load runs. Bucket is one bucket's decisions; Envoy is the filter's
// global client: one stream, the reports, the assignments. It reports
// every 5 s whatever reporting_interval says (Config.Interval changes it
// only for what Envoy cannot do); a bucket's first request is decided by
// no_assignment_behavior and reported at once, alone; each report carries
// every bucket; a stream the server ends is opened again at the next
// report timer, and reports that find none are dropped. docs/rlqs.md says
// what the filter does, with the source file of each rule.
package envoysim

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ReportInterval is the filter's report interval, fixed in its source.
const ReportInterval = 5 * time.Second

// Config configures an Envoy.
type Config struct {
	// Conn is the connection to the quota service (a node's gRPC port,
	// or Endpoints over several).
	Conn grpc.ClientConnInterface
	// Domain is the filter's domain.
	Domain string
	// Interval is the report interval; zero means ReportInterval, what
	// Envoy does.
	Interval time.Duration
	// Settings are every bucket's.
	Settings Settings
	// Now is the filter's clock; nil means time.Now.
	Now func() time.Time
}

// Envoy is one simulated Envoy: Allow decides, Run reports. It is safe
// for concurrent use.
type Envoy struct {
	conf  Config
	first chan struct{} // closed by the first bucket: Run starts reporting
	fresh chan struct{} // a first report is waiting

	mu      sync.Mutex
	buckets map[string]*bucket
	pending []*bucket // new buckets whose first report is not sent yet
	stream  rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	started bool
	stats   Stats
}

type bucket struct {
	id              map[string]string
	state           Bucket
	allowed, denied uint64
	lastReport      time.Time
}

// New returns an Envoy. It starts nothing: Run does.
func New(conf Config) *Envoy {
	if conf.Now == nil {
		conf.Now = time.Now
	}
	if conf.Interval <= 0 {
		conf.Interval = ReportInterval
	}
	return &Envoy{conf: conf, buckets: map[string]*bucket{}, first: make(chan struct{}), fresh: make(chan struct{}, 1)}
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
		ok := e.conf.Settings.FirstAllowed()
		b = &bucket{id: maps.Clone(id), lastReport: now}
		if ok {
			b.allowed++
		} else {
			b.denied++
		}
		e.buckets[k] = b
		e.pending = append(e.pending, b)
		if !e.started {
			e.started = true
			close(e.first)
		}
		select {
		case e.fresh <- struct{}{}:
		default:
		}
		return ok
	}
	ok := b.state.Decide(&e.conf.Settings, now)
	if ok {
		b.allowed++
	} else {
		b.denied++
	}
	return ok
}

// Run reports until ctx ends: each new bucket at once, alone, and every
// bucket every Interval from the first bucket on.
func (e *Envoy) Run(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-e.first:
	}
	tick := time.NewTicker(e.conf.Interval)
	defer tick.Stop()
	e.openStream(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-e.fresh:
			e.mu.Lock()
			bs := e.pending
			e.pending = nil
			e.mu.Unlock()
			for _, b := range bs {
				e.report(ctx, []*bucket{b}, false)
			}
		case <-tick.C:
			e.mu.Lock()
			bs := slices.Collect(maps.Values(e.buckets))
			e.pending = nil
			e.mu.Unlock()
			e.report(ctx, bs, true)
		}
	}
}

// openStream opens the stream if none is open; it reports whether one is.
func (e *Envoy) openStream(ctx context.Context) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stream != nil {
		return true
	}
	st, err := rlqspb.NewRateLimitQuotaServiceClient(e.conf.Conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		return false
	}
	e.stream = st
	e.stats.Streams++
	go e.receive(st)
	return true
}

// report sends the usage of bs on the stream; reopen says the timer's
// report opens the stream if it is down (a first report does not).
func (e *Envoy) report(ctx context.Context, bs []*bucket, reopen bool) {
	now := e.conf.Now()
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: e.conf.Domain}
	e.mu.Lock()
	for _, b := range bs {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqspb.BucketId{Bucket: b.id}, TimeElapsed: &durationpb.Duration{Seconds: int64(now.Sub(b.lastReport) / time.Second)},
			NumRequestsAllowed: b.allowed, NumRequestsDenied: b.denied})
		b.allowed, b.denied, b.lastReport = 0, 0, now
	}
	st := e.stream
	e.mu.Unlock()
	if st == nil && reopen && e.openStream(ctx) {
		e.mu.Lock()
		st = e.stream
		e.mu.Unlock()
	}
	if st == nil {
		e.mu.Lock()
		e.stats.Dropped++
		e.mu.Unlock()
		return // the usage is dropped, as the filter drops it
	}
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
			k := keyOf(a.GetBucketId().GetBucket())
			b := e.buckets[k]
			if b == nil || len(a.GetBucketId().GetBucket()) == 0 {
				continue // an action for a bucket it does not hold: ignored, as the filter does
			}
			if q := a.GetQuotaAssignmentAction(); q != nil {
				e.stats.Assignments++
				if q.GetAssignmentTimeToLive().GetSeconds() == 0 {
					e.stats.ZeroTTL++
				}
			}
			if b.state.Apply(&e.conf.Settings, a, now) {
				delete(e.buckets, k)
				e.stats.Abandoned++
			}
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

// Stats are counts of what an Envoy received and did.
type Stats struct {
	// Assignments counts the quota assignments received, ZeroTTL those
	// of a zero time-to-live, Abandoned the abandon actions, Streams the
	// streams opened, Dropped the reports dropped for want of a stream.
	Assignments, ZeroTTL, Abandoned, Streams, Dropped int
}

// Stats returns the counts so far.
func (e *Envoy) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stats
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
