package envoysim

import (
	"context"
	"errors"
	"io"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

var t0 = time.Unix(1_000_000, 0)

func tokenBucket(maxTokens, perFill uint32, fill time.Duration) *typepb.RateLimitStrategy {
	return &typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_TokenBucket{TokenBucket: &typepb.TokenBucket{
		MaxTokens: maxTokens, TokensPerFill: wrapperspb.UInt32(perFill), FillInterval: durationpb.New(fill)}}}
}

func blanketRule(r typepb.RateLimitStrategy_BlanketRule) *typepb.RateLimitStrategy {
	return &typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

var (
	allowAll = blanketRule(typepb.RateLimitStrategy_ALLOW_ALL)
	denyAll  = blanketRule(typepb.RateLimitStrategy_DENY_ALL)
)

func assign(s *typepb.RateLimitStrategy, ttl time.Duration) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
		QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: s}}}
}

// step is one event of a bucket's timeline: at, an action applied, or n
// requests decided (want admitted of them), or the tokens checked.
type step struct {
	at       time.Duration
	apply    *rlqspb.RateLimitQuotaResponse_BucketAction
	n, want  int
	tokens   float64 // checked when n == 0 and apply == nil; -1: no token bucket
	abandons bool
}

// TestBucketFollowsTheFilter pins each behaviour of Envoy's filter that
// Bucket models, with the source file it follows
// (source/extensions/filters/http/rate_limit_quota/ unless said).
func TestBucketFollowsTheFilter(t *testing.T) {
	expired := Settings{NoAssignment: denyAll, Expired: tokenBucket(4, 60, time.Minute), ExpiredTimeout: 3500 * time.Millisecond}
	for _, tc := range []struct {
		name, source string
		settings     Settings
		steps        []step
	}{
		{"no no_assignment_behavior allows all", "filter.cc: recordBucketUsage, a default ALLOW_ALL", Settings{},
			[]step{{n: 5, want: 5}}},
		{"no_assignment_behavior DENY_ALL denies until assigned", "filter.cc: the default action", Settings{NoAssignment: denyAll},
			[]step{{n: 3, want: 0}, {apply: assign(allowAll, 2*time.Second)}, {n: 3, want: 3}}},
		{"a new token bucket starts full, refilled per whole second of fill_interval", "global_client_impl.cc: createTokenBucketFromAction", Settings{},
			[]step{{apply: assign(tokenBucket(10, 3, 1500*time.Millisecond), time.Minute)}, {n: 12, want: 10},
				{at: time.Second, n: 5, want: 3}}}, // 3 per whole second (1.5 s counts 1)
		{"an equal assignment keeps its tokens and renews the time-to-live", "global_client_impl.cc: protoTokenBucketsEq, shouldReplaceTokenBucket", Settings{NoAssignment: denyAll},
			[]step{{apply: assign(tokenBucket(10, 1, time.Hour), 2*time.Second)}, {n: 8, want: 8},
				{at: time.Second, apply: assign(tokenBucket(10, 1, time.Hour), 2*time.Second)}, {at: time.Second, tokens: 2},
				{at: 2500 * time.Millisecond, n: 3, want: 2}}},
		{"equality reads the nanoseconds of fill_interval, not its seconds", "global_client_impl.cc: protoTokenBucketsEq", Settings{},
			[]step{{apply: assign(tokenBucket(10, 1, time.Hour), time.Minute)}, {n: 8, want: 8},
				{apply: assign(tokenBucket(10, 1, 2*time.Hour), time.Minute)}, {tokens: 2}}},
		{"a changed token bucket starts at the old level, scaled and rounded down", "global_client_impl.cc: createTokenBucketFromAction (initial tokens)", Settings{},
			[]step{{apply: assign(tokenBucket(10, 1, time.Hour), time.Minute)}, {n: 7, want: 7},
				{apply: assign(tokenBucket(25, 1, time.Hour), time.Minute)}, {tokens: 7}, // floor(25 × 3 / 10)
				{n: 8, want: 7}}},
		{"a token bucket after a blanket rule starts full", "global_client_impl.cc: onQuotaResponseImpl, a blanket rule carries no token bucket", Settings{},
			[]step{{apply: assign(tokenBucket(10, 1, time.Hour), time.Minute)}, {n: 10, want: 10},
				{apply: assign(denyAll, time.Minute)}, {n: 2, want: 0},
				{apply: assign(tokenBucket(10, 1, time.Hour), time.Minute)}, {tokens: 10}}},
		{"the time-to-live counts whole seconds from arrival", "global_client_impl.cc: startActionExpirationTimer", Settings{NoAssignment: denyAll},
			[]step{{apply: assign(allowAll, 1900*time.Millisecond)}, {at: 999 * time.Millisecond, n: 1, want: 1}, {at: time.Second, n: 1, want: 0}}},
		{"a zero time-to-live expires at once", "global_client_impl.cc: startActionExpirationTimer", Settings{NoAssignment: denyAll},
			[]step{{apply: assign(allowAll, 0)}, {n: 2, want: 0}}},
		{"expiry runs expired_assignment_behavior for its timeout, then no_assignment_behavior", "global_client_impl.cc: onActionExpirationTimer, onFallbackExpirationTimer", expired,
			[]step{{apply: assign(tokenBucket(10, 1, time.Hour), time.Second)}, {n: 9, want: 9},
				{at: time.Second, tokens: 0},         // the fallback: a new token bucket at the old level, floor(4 × 1 / 10)
				{at: 3 * time.Second, n: 2, want: 2}, // refilled 1 a second: 2
				{at: 4 * time.Second, n: 1, want: 0}, // the timeout's 3 whole seconds ran out: DENY_ALL
				{at: 4 * time.Second, tokens: -1}}},
		{"expiry without a fallback goes back to no_assignment_behavior", "global_client_impl.cc: onActionExpirationTimer", Settings{},
			[]step{{apply: assign(denyAll, time.Second)}, {n: 1, want: 0}, {at: time.Second, n: 3, want: 3}}},
		{"an abandon action erases the bucket", "global_client_impl.cc: onQuotaResponseImpl", Settings{},
			[]step{{apply: &rlqspb.RateLimitQuotaResponse_BucketAction{BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{
				AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}, abandons: true}}},
		{"requests_per_time_unit is skipped", "global_client_impl.cc: onQuotaResponseImpl", Settings{NoAssignment: denyAll},
			[]step{{apply: assign(&typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_RequestsPerTimeUnit_{}}, time.Minute)}, {n: 1, want: 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Logf("follows %s", tc.source)
			var b Bucket
			for i, s := range tc.steps {
				now := t0.Add(s.at)
				switch {
				case s.apply != nil:
					if got := b.Apply(&tc.settings, s.apply, now); got != s.abandons {
						t.Errorf("step %d: Apply abandons %v, want %v", i, got, s.abandons)
					}
				case s.n > 0:
					got := 0
					for range s.n {
						if b.Decide(&tc.settings, now) {
							got++
						}
					}
					if got != s.want {
						t.Errorf("step %d at %v: %d of %d admitted, want %d", i, s.at, got, s.n, s.want)
					}
				default:
					if got := b.Tokens(&tc.settings, now); math.Abs(got-s.tokens) > 0.01 {
						t.Errorf("step %d at %v: %v tokens, want %v", i, s.at, got, s.tokens)
					}
				}
			}
		})
	}
}

// TestTokenBucketNoAssignmentCrashes: Envoy dereferences a null limiter
// when a token bucket is no_assignment_behavior (filter.cc,
// shouldAllowRequest), so Decide panics.
func TestTokenBucketNoAssignmentCrashes(t *testing.T) {
	s := Settings{NoAssignment: tokenBucket(10, 10, time.Second)}
	if !s.FirstAllowed() {
		t.Error("the first request under a token bucket no_assignment_behavior is refused; the filter allows it")
	}
	defer func() {
		if r := recover(); r != ErrNullLimiter {
			t.Errorf("Decide recovered %v, want the null-limiter panic", r)
		}
	}()
	var b Bucket
	b.Decide(&s, t0)
}

// fakeConn is a quota service in the process: each stream records what
// it is sent and answers what the test pushes.
type fakeConn struct {
	mu      sync.Mutex
	streams []*fakeStream
}

func (c *fakeConn) Invoke(context.Context, string, any, any, ...grpc.CallOption) error {
	return errors.New("no unary call")
}

func (c *fakeConn) NewStream(ctx context.Context, _ *grpc.StreamDesc, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := &fakeStream{ctx: ctx, in: make(chan *rlqspb.RateLimitQuotaResponse, 8), end: make(chan struct{})}
	c.streams = append(c.streams, st)
	return st, nil
}

func (c *fakeConn) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.streams)
}

func (c *fakeConn) last() *fakeStream {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.streams[len(c.streams)-1]
}

type fakeStream struct {
	ctx  context.Context
	mu   sync.Mutex
	sent []*rlqspb.RateLimitQuotaUsageReports
	in   chan *rlqspb.RateLimitQuotaResponse
	end  chan struct{}
	once sync.Once
}

func (s *fakeStream) SendMsg(m any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, m.(*rlqspb.RateLimitQuotaUsageReports))
	return nil
}

func (s *fakeStream) RecvMsg(m any) error {
	select {
	case r := <-s.in:
		proto.Merge(m.(*rlqspb.RateLimitQuotaResponse), r)
		return nil
	case <-s.end:
		return io.EOF
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

func (s *fakeStream) reports() []*rlqspb.RateLimitQuotaUsageReports {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*rlqspb.RateLimitQuotaUsageReports(nil), s.sent...)
}

func (s *fakeStream) close()                       { s.once.Do(func() { close(s.end) }) }
func (s *fakeStream) Header() (metadata.MD, error) { return nil, nil }
func (s *fakeStream) Trailer() metadata.MD         { return nil }
func (s *fakeStream) CloseSend() error             { return nil }
func (s *fakeStream) Context() context.Context     { return s.ctx }

// TestEnvoyReports pins the filter's reports (global_client_impl.cc,
// filter_persistence.cc): the first request of a bucket is reported at
// once, alone, with time_elapsed 0; every bucket is reported every 5 s,
// whatever else, with the counts since its last report and time_elapsed
// in whole seconds; a stream the server ends is opened again only at the
// next report, and a first report sent meanwhile is dropped.
func TestEnvoyReports(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conn := &fakeConn{}
		e := New(Config{Conn: conn, Domain: "edge"})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan struct{})
		go func() { e.Run(ctx); close(done) }()
		a := map[string]string{"tenant": "a"}
		if !e.Allow(a) {
			t.Fatal("the first request of a bucket, no no_assignment_behavior: refused")
		}
		synctest.Wait()
		st := conn.last()
		r := st.reports()
		if len(r) != 1 || len(r[0].GetBucketQuotaUsages()) != 1 || r[0].GetDomain() != "edge" ||
			r[0].GetBucketQuotaUsages()[0].GetNumRequestsAllowed() != 1 || r[0].GetBucketQuotaUsages()[0].GetTimeElapsed().GetSeconds() != 0 {
			t.Fatalf("after the first request: %v, want one report of the bucket alone, one allowed, time_elapsed 0", r)
		}
		time.Sleep(1700 * time.Millisecond)
		e.Allow(map[string]string{"tenant": "b"}) // b's first report: alone, at once
		e.Allow(a)
		e.Allow(a)
		time.Sleep(5*time.Second - 1700*time.Millisecond + time.Millisecond) // the 5 s tick since the first bucket
		synctest.Wait()
		r = st.reports()
		if len(r) != 3 || len(r[1].GetBucketQuotaUsages()) != 1 || len(r[2].GetBucketQuotaUsages()) != 2 {
			t.Fatalf("after 5 s: %d messages %v, want the two first reports and one of both buckets", len(r), r)
		}
		for _, u := range r[2].GetBucketQuotaUsages() {
			want := map[string]struct {
				allowed uint64
				secs    int64
			}{"a": {2, 5}, "b": {0, 3}}[u.GetBucketId().GetBucket()["tenant"]]
			if u.GetNumRequestsAllowed() != want.allowed || u.GetTimeElapsed().GetSeconds() != want.secs {
				t.Errorf("the 5 s report of %v: %d allowed, time_elapsed %ds; want %d and %ds (whole seconds)",
					u.GetBucketId().GetBucket(), u.GetNumRequestsAllowed(), u.GetTimeElapsed().GetSeconds(), want.allowed, want.secs)
			}
		}
		st.close() // the server ends the stream
		synctest.Wait()
		e.Allow(map[string]string{"tenant": "c"}) // its first report finds no stream: dropped
		synctest.Wait()
		if n := conn.count(); n != 1 {
			t.Fatalf("%d streams before the next report, want 1: Envoy reopens only at its report timer", n)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if n := conn.count(); n != 2 {
			t.Fatalf("%d streams after the next report, want 2", n)
		}
		if r := conn.last().reports(); len(r) != 1 || len(r[0].GetBucketQuotaUsages()) != 3 {
			t.Errorf("the new stream's first message: %v, want every bucket", r)
		}
		if s := e.Stats(); s.Dropped != 1 || s.Streams != 2 {
			t.Errorf("stats %+v, want 1 report dropped and 2 streams", s)
		}
		cancel()
		<-done
	})
}
