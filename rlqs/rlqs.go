// Package rlqs serves Envoy's rate limit quota service,
// envoy.service.rate_limit_quota.v3.RateLimitQuotaService: Envoy's
// rate_limit_quota filter decides requests itself, from an assignment per
// bucket, and reports its usage on one stream (docs/rlqs.md).
//
// Each stream is a lessee (package lease) with a random secret, so an
// account of its own on each counter's owner. A bucket_id is matched
// against the stream's domain in the policy files as an RLS descriptor
// (Match); each report of a bucket becomes a share report of running
// totals, sent through lease.Node.Lease to the counter's owner, which
// splits the limit's rate among the streams by demand (global/shares.go);
// each share becomes a refilling token bucket assignment (bucket.go), so
// the Envoys together admit at most the limit.
package rlqs

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/global"
	"github.com/ringlimit/ringlimit/internal/mux"
	"github.com/ringlimit/ringlimit/lease"
	"github.com/ringlimit/ringlimit/policy"
)

// Method is the full name of the stream, as the node's admission gate
// counts it (a long-lived stream, not a request in flight).
const Method = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"

// The defaults of Config.
const (
	DefaultMaxStreams          = 1000
	DefaultMaxBucketsPerStream = 1000
	DefaultAssignmentTTL       = time.Second
	DefaultAbandonAfter        = 30
)

// Leaser takes a lessee's reports to their counters' owners:
// *service.Service (lease.Node.Lease).
type Leaser interface {
	Lease(ctx context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error)
}

// Policies returns the policies in force: *policy.Reloader. A nil Set
// means no policy file was given.
type Policies interface {
	Policies() *policy.Set
}

// Bounds are a Server's flags. The zero value of each means its default.
type Bounds struct {
	// MaxStreams bounds the streams open on this node
	// (--rlqs-max-streams); a stream beyond it is refused with
	// RESOURCE_EXHAUSTED.
	MaxStreams int
	// MaxBucketsPerStream bounds one stream's buckets
	// (--rlqs-max-buckets-per-stream), at most lease.MaxReports: the
	// reports of a bucket beyond it are ignored, and Envoy applies its
	// no_assignment_behavior to that bucket.
	MaxBucketsPerStream int
	// AssignmentTTL is each assignment's time-to-live
	// (--rlqs-assignment-ttl): whole seconds, as Envoy's filter reads
	// only the seconds, and shorter than the lease time-to-live, so that
	// Envoy stops using a grant before its owner frees it. An assignment
	// is renewed every half of it.
	AssignmentTTL time.Duration
	// AbandonAfter is how many reports in a row without a request make
	// a bucket idle (--rlqs-abandon-after): it is abandoned
	// (AbandonAction), and its grant goes back to its owner by the
	// lease time-to-live.
	AbandonAfter int
}

// DefaultBounds are the flags' defaults.
func DefaultBounds() Bounds {
	return Bounds{MaxStreams: DefaultMaxStreams, MaxBucketsPerStream: DefaultMaxBucketsPerStream,
		AssignmentTTL: DefaultAssignmentTTL, AbandonAfter: DefaultAbandonAfter}
}

// Check returns an error naming the flag out of range.
func (b Bounds) Check() error {
	switch {
	case b.MaxStreams <= 0:
		return fmt.Errorf("--rlqs-max-streams: must be positive, got %d", b.MaxStreams)
	case b.MaxBucketsPerStream <= 0 || b.MaxBucketsPerStream > lease.MaxReports:
		return fmt.Errorf("--rlqs-max-buckets-per-stream: must be between 1 and %d (a lease call's reports), got %d", lease.MaxReports, b.MaxBucketsPerStream)
	case b.AssignmentTTL < time.Second || b.AssignmentTTL%time.Second != 0:
		return fmt.Errorf("--rlqs-assignment-ttl: must be whole seconds, at least 1s (Envoy reads only the seconds), got %v", b.AssignmentTTL)
	case b.AbandonAfter <= 0:
		return fmt.Errorf("--rlqs-abandon-after: must be positive, got %d", b.AbandonAfter)
	}
	return nil
}

// Config configures a Server. Leaser and Policies are required.
type Config struct {
	Leaser   Leaser
	Policies Policies
	Bounds
	// LeaseTTL is the node's --lease-ttl; zero means
	// global.DefaultLeaseTTL. Streams are refused, FAILED_PRECONDITION,
	// unless it exceeds AssignmentTTL by a second.
	LeaseTTL   time.Duration
	Registerer prometheus.Registerer
	// Logger; nil discards.
	Logger *slog.Logger
	// Now is the clock of the grants' accounting; nil means time.Now.
	Now func() time.Time
	// StreamSendTimeout ends a stream once a message has waited that long
	// for its Envoy to read it (gRPC's flow control blocks the send of a
	// client that reads nothing); StreamIdleTimeout ends one that has
	// sent no message for that long (see StreamRateLimitQuotas). Zero
	// means never. StreamEnded, if not nil, is told of each stream so
	// ended, with mux.ErrNotRead or the idle status. The stream's RPC
	// context must come through mux.Stoppable for a stream whose send is
	// blocked to end at once; without it, it ends when StreamEnded frees
	// the send (by closing the connection) or the Envoy reads.
	StreamSendTimeout, StreamIdleTimeout time.Duration
	StreamEnded                          func(ctx context.Context, reason error)
	// MaxBytes bounds the memory the streams hold (their buckets' ids and
	// state, about streamBytes a stream): the node's share of
	// --memory-limit. A bucket beyond it is abandoned, and counted
	// (ringlimit_rlqs_refused_total{reason="memory"}); a stream beyond it
	// is refused RESOURCE_EXHAUSTED. Zero means no bound but the counts.
	MaxBytes int64
	// UnknownDomain, if not nil, is told of each stream refused for a
	// domain no policy file has (policy.UnknownDomains.Saw).
	UnknownDomain func(domain string)
}

// Server serves StreamRateLimitQuotas. It is safe for concurrent use and
// starts nothing but the goroutines of the streams it serves.
type Server struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer
	conf    Config
	metrics *metrics
	// refuse, when not empty, is why every stream is refused.
	refuse string

	mu       sync.Mutex
	streams  map[*stream]struct{}
	draining bool
	// bytes is what the streams hold, as Config.MaxBytes counts it.
	bytes atomic.Int64
}

// What Config.MaxBytes counts: a stream's own state (its goroutines'
// stacks and buffers), and each bucket's id (twice: the id, and its key on
// the stream) with its entries' and the bucket's overhead.
const (
	streamBytes      = 16 << 10
	bucketBytes      = 512
	bucketEntryBytes = 64
)

// take counts n bytes of the streams' memory, or reports that they would
// pass Config.MaxBytes.
func (s *Server) take(n int64) bool {
	if s.conf.MaxBytes <= 0 {
		s.bytes.Add(n)
		return true
	}
	for {
		cur := s.bytes.Load()
		if cur+n > s.conf.MaxBytes {
			return false
		}
		if s.bytes.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// New returns a Server, or the error of Bounds.Check.
func New(conf Config) (*Server, error) {
	d := DefaultBounds()
	if conf.MaxStreams <= 0 {
		conf.MaxStreams = d.MaxStreams
	}
	if conf.MaxBucketsPerStream <= 0 {
		conf.MaxBucketsPerStream = d.MaxBucketsPerStream
	}
	if conf.AssignmentTTL <= 0 {
		conf.AssignmentTTL = d.AssignmentTTL
	}
	if conf.AbandonAfter <= 0 {
		conf.AbandonAfter = d.AbandonAfter
	}
	if conf.LeaseTTL <= 0 {
		conf.LeaseTTL = global.DefaultLeaseTTL
	}
	if err := conf.Bounds.Check(); err != nil {
		return nil, err
	}
	if conf.Logger == nil {
		conf.Logger = slog.New(slog.DiscardHandler)
	}
	if conf.Now == nil {
		conf.Now = time.Now
	}
	s := &Server{conf: conf, metrics: newMetrics(conf.Registerer), streams: map[*stream]struct{}{}}
	if conf.AssignmentTTL+global.ShareDelivery > conf.LeaseTTL {
		// An assignment must end, on Envoy's clock, before its owner frees
		// the grant behind it, with a second for its delivery. A node
		// whose leases are shorter still serves everything else.
		s.refuse = fmt.Sprintf("--rlqs-assignment-ttl (%v) must be at most --lease-ttl (%v) less %v, so that Envoy stops using a grant before its owner frees it",
			conf.AssignmentTTL, conf.LeaseTTL, global.ShareDelivery)
	}
	return s, nil
}

// Register registers s on srv.
func (s *Server) Register(srv grpc.ServiceRegistrar) {
	rlqspb.RegisterRateLimitQuotaServiceServer(srv, s)
}

// Drain tells every stream's Envoy to fall back at once (each assignment
// again, with a time-to-live of zero) and ends the streams with
// UNAVAILABLE, so that Envoy opens its next stream to another node; it
// refuses streams from then on. It returns once every stream has ended,
// or ctx has.
func (s *Server) Drain(ctx context.Context) {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		return
	}
	s.draining = true
	var told []chan struct{}
	for st := range s.streams {
		told = append(told, st.drained)
		close(st.drain)
	}
	s.mu.Unlock()
	for _, c := range told {
		select {
		case <-c:
		case <-ctx.Done():
			return
		}
	}
}

// open counts a new stream, or refuses it.
func (s *Server) open() (*stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.refuse != "":
		return nil, status.Error(codes.FailedPrecondition, s.refuse)
	case s.draining:
		return nil, status.Error(codes.Unavailable, "node draining: open the stream on another node")
	case len(s.streams) >= s.conf.MaxStreams:
		s.metrics.refused.WithLabelValues("streams").Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "streams: --rlqs-max-streams %d reached on this node", s.conf.MaxStreams)
	case !s.take(streamBytes):
		s.metrics.refused.WithLabelValues("memory").Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "memory: the quota streams' share of --memory-limit (%d bytes) is full on this node", s.conf.MaxBytes)
	}
	secret := make([]byte, lease.SecretLen)
	rand.Read(secret) // never fails (crypto/rand)
	st := &stream{srv: s, secret: secret, buckets: map[string]*bucket{}, drain: make(chan struct{}), drained: make(chan struct{})}
	s.streams[st] = struct{}{}
	s.metrics.streams.Inc()
	return st, nil
}

// close forgets st. Its accounts stay on their owners until their
// time-to-live runs out, covering what the Envoy admitted and has not
// reported: it reports it on its next stream, whose account claims it.
func (s *Server) close(st *stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.streams, st)
	s.metrics.streams.Dec()
	s.metrics.buckets.Sub(float64(len(st.buckets)))
	var n int64 = streamBytes
	for _, b := range st.buckets {
		n += b.bytes()
	}
	s.bytes.Add(-n)
}

// StreamRateLimitQuotas serves one Envoy's stream: each message of usage
// reports is answered with the assignments it changes or renews, and the
// assignments are renewed every half time-to-live between reports. A
// stream must earn its slot: one whose Envoy reads nothing, so that a
// message waits StreamSendTimeout, is ended (mux.ErrNotRead, see send),
// and so is one that sends no message for StreamIdleTimeout
// (DEADLINE_EXCEEDED, naming the bound), which a live Envoy, reporting
// every interval, never reaches. See docs/design-ports.md, "Connections
// and streams earn their slots".
func (s *Server) StreamRateLimitQuotas(gs rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	st, err := s.open()
	if err != nil {
		return err
	}
	defer close(st.drained)
	defer s.close(st)
	ctx := gs.Context()
	msgs := make(chan *rlqspb.RateLimitQuotaUsageReports)
	ended := make(chan error, 1)
	var lastRecv atomic.Int64 // Unix ns of the last message received
	lastRecv.Store(time.Now().UnixNano())
	// The receiving goroutine ends when the stream does: returning from
	// this handler ends the stream, and Recv with it.
	go func() {
		for {
			m, err := gs.Recv()
			if err != nil {
				ended <- err
				return
			}
			lastRecv.Store(time.Now().UnixNano())
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	// Assignments are renewed when half their time-to-live is left, within
	// a fifth of it: well before they could expire at the Envoy.
	renew := time.NewTicker(s.conf.AssignmentTTL / 5)
	defer renew.Stop()
	var idle <-chan time.Time // nil: never idle
	var idleTimer *time.Timer
	if d := s.conf.StreamIdleTimeout; d > 0 {
		idleTimer = time.NewTimer(d)
		defer idleTimer.Stop()
		idle = idleTimer.C
	}
	for {
		var resp *rlqspb.RateLimitQuotaResponse
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-idle:
			// The timer runs from the last message it saw: a message since
			// sets it again for the rest of its bound.
			d := s.conf.StreamIdleTimeout
			if since := time.Since(time.Unix(0, lastRecv.Load())); since < d {
				idleTimer.Reset(d - since)
				continue
			}
			err := status.Errorf(codes.DeadlineExceeded, "stream idle: no usage report for %v (--stream-idle-timeout), though Envoy reports every reporting_interval: open a new stream", d)
			s.ended(ctx, err)
			return err
		case err := <-ended:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-st.drain:
			return st.drainStream(ctx, gs, msgs, ended)
		case m := <-msgs:
			if resp, err = st.take(ctx, m); err != nil {
				s.metrics.refused.WithLabelValues("invalid").Inc()
				return err
			}
		case <-renew.C:
			resp = st.renew(ctx)
		}
		if len(resp.GetBucketAction()) > 0 {
			if err := st.send(gs, resp); err != nil {
				return err
			}
		}
	}
}

// ended tells Config.StreamEnded, if set, that the stream of ctx was
// ended for reason.
func (s *Server) ended(ctx context.Context, reason error) {
	if s.conf.StreamEnded != nil {
		s.conf.StreamEnded(ctx, reason)
	}
}

// send sends resp on gs. A send that has not returned within
// StreamSendTimeout (its Envoy reads nothing, and gRPC's flow control
// holds the send) ends the stream: mux.End ends the RPC's context, which
// returns the send, and StreamEnded is told, which may close the
// connection. send then returns mux.ErrNotRead, whatever the send said.
func (st *stream) send(gs rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer, resp *rlqspb.RateLimitQuotaResponse) error {
	d := st.srv.conf.StreamSendTimeout
	if d <= 0 {
		return gs.Send(resp)
	}
	if st.sendTimer == nil {
		st.sendTimer = time.AfterFunc(d, func() {
			mux.End(gs, mux.ErrNotRead)
			st.srv.ended(gs.Context(), mux.ErrNotRead)
		})
	} else {
		st.sendTimer.Reset(d)
	}
	err := gs.Send(resp)
	if !st.sendTimer.Stop() {
		return mux.ErrNotRead // the timer fired: the stream is ended
	}
	return err
}

// stream is one Envoy stream: its secret (its accounts' name on the
// owners) and its buckets. Only its handler's goroutine touches it, but
// for drain and drained, which the Server closes and waits on.
type stream struct {
	srv     *Server
	secret  []byte
	domain  string
	epoch   int64 // the last account epoch given to a bucket
	buckets map[string]*bucket
	// set is the policies the buckets were matched against.
	set *policy.Set
	// drain is closed by Drain; drained by the handler as it returns.
	drain, drained chan struct{}
	// sendTimer ends the stream when a send takes StreamSendTimeout
	// (see send); nil until the first send, and stopped after each.
	sendTimer *time.Timer
}

// take answers a message of usage reports, or returns the status that
// ends the stream: only an error of the message itself does (see
// validate); a usage that breaks a rule is ignored and counted.
func (st *stream) take(ctx context.Context, m *rlqspb.RateLimitQuotaUsageReports) (*rlqspb.RateLimitQuotaResponse, error) {
	first := st.domain == ""
	domain, usages, bad, err := validate(st.domain, m)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if len(bad) > 0 {
		st.srv.metrics.refused.WithLabelValues("invalid_bucket").Add(float64(len(bad)))
		st.srv.conf.Logger.Debug("rlqs: usages ignored", "usages", len(bad), "first", bad[0])
	}
	set := st.srv.conf.Policies.Policies()
	switch {
	case set == nil:
		return nil, status.Error(codes.FailedPrecondition, "no policies: start rlnode with --policy-file")
	case first && !set.HasDomain(domain):
		if st.srv.conf.UnknownDomain != nil {
			st.srv.conf.UnknownDomain(domain)
		}
		return nil, status.Errorf(codes.NotFound, "domain: %q is not a domain of the policy files", domain)
	}
	st.domain = domain
	now := st.srv.conf.Now()
	if set != st.set {
		st.rematch(set)
	}
	resp := &rlqspb.RateLimitQuotaResponse{}
	var due []*bucket
	for _, u := range usages {
		b := st.buckets[u.key]
		if b == nil {
			if b = st.subscribe(set, u); b == nil {
				// Beyond a bound: abandoned, so that Envoy forgets it
				// (and its next request subscribes it again).
				resp.BucketAction = append(resp.BucketAction, st.abandon(u.id))
				continue
			}
		}
		b.report(u, now)
		if b.idle >= st.srv.conf.AbandonAfter {
			resp.BucketAction = append(resp.BucketAction, st.abandon(b.id))
			st.forget(b)
			continue
		}
		due = append(due, b)
	}
	st.assign(ctx, due, now, resp)
	return resp, nil
}

// abandon is the AbandonAction of the bucket id, counted.
func (st *stream) abandon(id *rlqspb.BucketId) *rlqspb.RateLimitQuotaResponse_BucketAction {
	st.srv.metrics.assignments.WithLabelValues("abandon").Inc()
	return &rlqspb.RateLimitQuotaResponse_BucketAction{BucketId: id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}
}

// subscribe starts the stream's bucket of u: a report of a bucket the
// stream has not seen (or has abandoned) subscribes to it, as Envoy's
// first report does. It returns nil, counted, for a bucket beyond
// --rlqs-max-buckets-per-stream or the streams' share of memory.
func (st *stream) subscribe(set *policy.Set, u usage) *bucket {
	b := &bucket{id: u.id, key: u.key}
	switch {
	case len(st.buckets) >= st.srv.conf.MaxBucketsPerStream:
		st.srv.metrics.refused.WithLabelValues("buckets_per_stream").Inc()
		return nil
	case !st.srv.take(b.bytes()):
		st.srv.metrics.refused.WithLabelValues("memory").Inc()
		return nil
	}
	st.epoch++
	b.epoch = st.epoch
	b.kind, b.item = Match(set, st.domain, u.entries)
	st.set = set
	if b.kind == unsupported {
		st.srv.metrics.refused.WithLabelValues("unsupported_policy").Inc()
	}
	st.buckets[u.key] = b
	st.srv.metrics.buckets.Inc()
	return b
}

// forget drops b from the stream.
func (st *stream) forget(b *bucket) {
	delete(st.buckets, b.key)
	st.srv.metrics.buckets.Dec()
	st.srv.bytes.Add(-b.bytes())
}

// bytes is what b counts of Config.MaxBytes.
func (b *bucket) bytes() int64 {
	return bucketBytes + 2*int64(len(b.key)) + bucketEntryBytes*int64(len(b.id.GetBucket()))
}

// rematch matches the stream's buckets against set, the policies now in
// force: a bucket whose limit changed starts a new account (a new epoch)
// of its new counter, which claims the share the Envoy holds.
func (st *stream) rematch(set *policy.Set) {
	st.set = set
	for _, b := range st.buckets {
		k, item := Match(set, st.domain, entriesOf(b.id))
		if k != b.kind || !proto.Equal(item, b.item) {
			st.epoch++
			b.kind, b.item, b.epoch = k, item, st.epoch
		}
	}
}

// renew renews the assignments that have half their time-to-live left or
// less.
func (st *stream) renew(ctx context.Context) *rlqspb.RateLimitQuotaResponse {
	now := st.srv.conf.Now()
	var due []*bucket
	for _, b := range st.buckets {
		if b.sent() && now.Sub(b.until) >= -st.srv.conf.AssignmentTTL/2 {
			due = append(due, b)
		}
	}
	resp := &rlqspb.RateLimitQuotaResponse{}
	st.assign(ctx, due, now, resp)
	return resp
}

// assign adds to resp the assignments of buckets: the fixed ones as they
// are, the leased ones from one lease call for all of them. A leased
// bucket whose report the owner did not take gets nothing: its
// assignment runs out by its time-to-live, before the owner frees the
// share behind it.
func (st *stream) assign(ctx context.Context, buckets []*bucket, now time.Time, resp *rlqspb.RateLimitQuotaResponse) {
	ttl := st.srv.conf.AssignmentTTL
	var lent []*bucket
	for _, b := range buckets {
		switch b.kind {
		case allowAll:
			b.cur, b.until = blanket(typepb.RateLimitStrategy_ALLOW_ALL), now.Add(ttl)
			resp.BucketAction = append(resp.BucketAction, st.action(b, b.cur, ttl))
		case denyAll:
			b.cur, b.until = blanket(typepb.RateLimitStrategy_DENY_ALL), now.Add(ttl)
			resp.BucketAction = append(resp.BucketAction, st.action(b, b.cur, ttl))
		case leased:
			lent = append(lent, b)
		}
	}
	grants := st.lease(ctx, lent, false)
	for i, g := range grants {
		if g != nil {
			resp.BucketAction = append(resp.BucketAction, st.action(lent[i], lent[i].assign(g, now, ttl), ttl))
		}
	}
}

// lease sends the accounts of buckets (all leased) to their owners in one
// call, with release if set, and returns the answers taken, in order (nil
// for a report not taken).
func (st *stream) lease(ctx context.Context, buckets []*bucket, release bool) []*pb.LeaseGrant {
	if len(buckets) == 0 {
		return nil
	}
	req := &pb.LeaseRequest{Lessee: st.secret}
	for _, b := range buckets {
		rep := b.leaseReport(release)
		if release {
			rep.Epoch++
		}
		req.Reports = append(req.Reports, rep)
	}
	out, err := st.srv.conf.Leaser.Lease(ctx, req)
	if err == nil && len(out.GetGrants()) != len(buckets) {
		err = fmt.Errorf("%d grants for %d reports", len(out.GetGrants()), len(buckets))
	}
	if err != nil {
		st.srv.metrics.refused.WithLabelValues("lease").Add(float64(len(buckets)))
		st.srv.conf.Logger.Warn("rlqs: lease call failed; assignments not renewed", "buckets", len(buckets), "err", err)
		return make([]*pb.LeaseGrant, len(buckets))
	}
	grants := out.GetGrants()
	for i, g := range grants {
		if g.GetError() != "" || g.GetEpoch() != req.Reports[i].GetEpoch() {
			st.srv.metrics.refused.WithLabelValues("lease").Inc()
			st.srv.conf.Logger.Debug("rlqs: lease report not taken", "bucket", buckets[i].id.GetBucket(), "err", g.GetError())
			grants[i] = nil
		}
	}
	return grants
}

// action is the assignment of strategy to b for ttl, counted.
func (st *stream) action(b *bucket, strategy *typepb.RateLimitStrategy, ttl time.Duration) *rlqspb.RateLimitQuotaResponse_BucketAction {
	label := "token_bucket"
	if r, ok := strategy.GetStrategy().(*typepb.RateLimitStrategy_BlanketRule_); ok {
		label = r.BlanketRule.String()
	}
	if ttl == 0 {
		label = "zero_ttl"
	}
	st.srv.metrics.assignments.WithLabelValues(label).Inc()
	return &rlqspb.RateLimitQuotaResponse_BucketAction{BucketId: b.id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: strategy}}}
}

// maxDrainWait bounds how long a draining stream waits for the Envoy's
// next report, whatever its reporting interval.
const maxDrainWait = 5 * time.Second

// drainStream ends a stream as its node drains: every assignment again
// with a zero time-to-live, so that the Envoy stops using it at once; then
// the Envoy's next report (awaited a report interval and two delivery
// margins at most), which carries what it admitted since its last one,
// is taken to the owners on this stream's accounts, where those hits are
// reserved, rather than left to the Envoy's next stream to claim; then
// the stream ends UNAVAILABLE, and the Envoy opens its next one
// elsewhere.
func (st *stream) drainStream(ctx context.Context, gs rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer,
	msgs <-chan *rlqspb.RateLimitQuotaUsageReports, ended <-chan error) error {
	if err := st.send(gs, st.zeroTTL()); err != nil {
		return err
	}
	var interval time.Duration
	for _, b := range st.buckets {
		interval = max(interval, b.interval)
	}
	wait := time.NewTimer(min(max(interval, st.srv.conf.AssignmentTTL), maxDrainWait) + 2*global.ShareDelivery)
	defer wait.Stop()
	select {
	case m := <-msgs:
		st.take(ctx, m) // its assignments are not sent: the stream ends
	case <-ended:
	case <-wait.C:
	case <-ctx.Done():
	}
	// The Envoy stopped using its shares when the zero time-to-live
	// arrived: give them back, so that its next stream, on another node,
	// gets them at once rather than after the lease time-to-live.
	var lent []*bucket
	for _, b := range st.buckets {
		if b.kind == leased {
			lent = append(lent, b)
		}
	}
	st.lease(context.WithoutCancel(ctx), lent, true)
	return status.Error(codes.Unavailable, "node draining: every assignment expired, open the stream on another node")
}

// zeroTTL is every assignment in force again, with a time-to-live of
// zero: Envoy's filter expires each at once and falls back to its
// expired-assignment behaviour until its next stream assigns it again.
func (st *stream) zeroTTL() *rlqspb.RateLimitQuotaResponse {
	resp := &rlqspb.RateLimitQuotaResponse{}
	for _, b := range st.buckets {
		if b.sent() {
			resp.BucketAction = append(resp.BucketAction, st.action(b, b.cur, 0))
		}
	}
	return resp
}
