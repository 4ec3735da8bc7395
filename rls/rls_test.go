package rls_test

import (
	"context"
	"math"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/policy"
	"github.com/ringlimit/ringlimit/rls"
	"github.com/ringlimit/ringlimit/service"
)

// t0 is 12:00:10.250 on a Sunday, inside every window.
var t0 = time.Date(2026, 11, 22, 12, 0, 10, 250_000_000, time.UTC)

// clock is a settable clock shared by the service and the RLS.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// startRLS serves the RLS of a one-node ringlimit on 127.0.0.1 and returns
// a client built from go-control-plane's types.
func startRLS(t testing.TB, path string, c *clock) rlspb.RateLimitServiceClient {
	t.Helper()
	return startRLSTelling(t, path, c, nil)
}

// startRLSTelling is startRLS, whose server tells unknown of each request
// for a domain no policy file has.
func startRLSTelling(t testing.TB, path string, c *clock, unknown func(string)) rlspb.RateLimitServiceClient {
	t.Helper()
	policies, err := policy.NewReloader(policy.ReloaderConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(service.Config{Now: c.now})
	srv := grpc.NewServer()
	rls.New(rls.Config{Checker: svc, Policies: policies, Now: c.now, UnknownDomain: unknown}).Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlspb.NewRateLimitServiceClient(conn)
}

// desc is a descriptor of key, value pairs.
func desc(kv ...string) *commonpb.RateLimitDescriptor {
	d := &commonpb.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func addend(d *commonpb.RateLimitDescriptor, n uint64) *commonpb.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func override(d *commonpb.RateLimitDescriptor, rpu uint32, unit typepb.RateLimitUnit) *commonpb.RateLimitDescriptor {
	d.Limit = &commonpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	return d
}

// want is the expected status of one descriptor. reset 0 means
// envoyproxy/ratelimit's own: the unit's length minus now modulo it, in
// whole seconds of Unix time.
type want struct {
	code      rlspb.RateLimitResponse_Code
	rpu       uint32
	unit      rlspb.RateLimitResponse_RateLimit_Unit
	name      string
	remaining uint32
	reset     int64
	limited   bool // has current_limit
}

const (
	ok   = rlspb.RateLimitResponse_OK
	over = rlspb.RateLimitResponse_OVER_LIMIT

	second = rlspb.RateLimitResponse_RateLimit_SECOND
	minute = rlspb.RateLimitResponse_RateLimit_MINUTE
	hour   = rlspb.RateLimitResponse_RateLimit_HOUR
	day    = rlspb.RateLimitResponse_RateLimit_DAY
	week   = rlspb.RateLimitResponse_RateLimit_WEEK
	month  = rlspb.RateLimitResponse_RateLimit_MONTH
	year   = rlspb.RateLimitResponse_RateLimit_YEAR
)

func limited(code rlspb.RateLimitResponse_Code, rpu uint32, unit rlspb.RateLimitResponse_RateLimit_Unit, remaining uint32) want {
	return want{code: code, rpu: rpu, unit: unit, remaining: remaining, limited: true}
}

func (w want) named(n string) want        { w.name = n; return w }
func (w want) resetIn(seconds int64) want { w.reset = seconds; return w }

var (
	noLimit   = want{code: ok}
	unlimited = want{code: ok, remaining: math.MaxUint32}
)

// divider is the unit's length in seconds, as envoyproxy/ratelimit has it.
var divider = map[rlspb.RateLimitResponse_RateLimit_Unit]int64{
	second: 1, minute: 60, hour: 3600, day: 86400, week: 7 * 86400, month: 30 * 86400, year: 365 * 86400,
}

func (w want) status(now time.Time) *rlspb.RateLimitResponse_DescriptorStatus {
	st := &rlspb.RateLimitResponse_DescriptorStatus{Code: w.code, LimitRemaining: w.remaining}
	if w.limited {
		st.CurrentLimit = &rlspb.RateLimitResponse_RateLimit{Name: w.name, RequestsPerUnit: w.rpu, Unit: w.unit}
		reset := w.reset
		if reset == 0 {
			d := divider[w.unit]
			reset = d - now.Unix()%d
		}
		st.DurationUntilReset = &durationpb.Duration{Seconds: reset}
	}
	return st
}

// step is one request and the answer envoyproxy/ratelimit gives it.
type step struct {
	name    string
	advance time.Duration // before the request
	hits    uint32        // request-level hits_addend
	descs   []*commonpb.RateLimitDescriptor
	overall rlspb.RateLimitResponse_Code
	want    []want
}

func ds(d ...*commonpb.RateLimitDescriptor) []*commonpb.RateLimitDescriptor { return d }
func ws(w ...want) []want                                                   { return w }

// TestShouldRateLimit plays request sequences on a configuration that
// uses every feature, against a real gRPC server, and compares each answer
// with envoyproxy/ratelimit's (read off its rules: config_impl.go,
// base_limiter.go, fixed_cache_impl.go and ratelimit.go at f2fb157).
func TestShouldRateLimit(t *testing.T) {
	sequences := []struct {
		name  string
		steps []step
	}{
		{"key only: one counter per value; a refused request is counted", []step{
			{name: "first", descs: ds(desc("remote_address", "1.1.1.1")), overall: ok, want: ws(limited(ok, 2, second, 1))},
			{name: "second", descs: ds(desc("remote_address", "1.1.1.1")), overall: ok, want: ws(limited(ok, 2, second, 0))},
			{name: "third is over", descs: ds(desc("remote_address", "1.1.1.1")), overall: over, want: ws(limited(over, 2, second, 0))},
			{name: "hits_addend 0 checks: the refusal was counted (3 > 2)", descs: ds(addend(desc("remote_address", "1.1.1.1"), 0)), overall: over, want: ws(limited(over, 2, second, 0))},
			{name: "another value", descs: ds(desc("remote_address", "2.2.2.2")), overall: ok, want: ws(limited(ok, 2, second, 1))},
			{name: "next second, next window", advance: time.Second, descs: ds(desc("remote_address", "1.1.1.1")), overall: ok, want: ws(limited(ok, 2, second, 1))},
		}},
		{"a limit applies at the depth of the last entry only", []step{
			{name: "user=alice", descs: ds(desc("user", "alice")), overall: ok, want: ws(limited(ok, 3, minute, 2))},
			{name: "user=alice, path", descs: ds(desc("user", "alice", "path", "/x")), overall: ok, want: ws(limited(ok, 1, hour, 0))},
			{name: "its own counter", descs: ds(desc("user", "alice", "path", "/x")), overall: over, want: ws(limited(over, 1, hour, 0))},
			{name: "another path, another counter", descs: ds(desc("user", "alice", "path", "/y")), overall: ok, want: ws(limited(ok, 1, hour, 0))},
			{name: "a level deeper than the tree", descs: ds(desc("user", "alice", "path", "/x", "method", "GET")), overall: ok, want: ws(noLimit)},
			{name: "a parent limit does not apply lower", descs: ds(desc("remote_address", "1.1.1.1", "path", "/x")), overall: ok, want: ws(noLimit)},
			{name: "user=alice counted once before", descs: ds(desc("user", "alice")), overall: ok, want: ws(limited(ok, 3, minute, 1))},
		}},
		{"key+value without a limit does not fall back to the key", []step{
			{name: "bob", descs: ds(desc("user", "bob")), overall: ok, want: ws(noLimit)},
			{name: "carol falls back", descs: ds(desc("user", "carol")), overall: ok, want: ws(limited(ok, 5, day, 4))},
		}},
		{"wildcards and share_threshold", []step{
			{name: "/api/a", descs: ds(desc("path", "/api/a")), overall: ok, want: ws(limited(ok, 2, minute, 1))},
			{name: "/api/b has its own counter", descs: ds(desc("path", "/api/b")), overall: ok, want: ws(limited(ok, 2, minute, 1))},
			{name: "/files/a", descs: ds(desc("path", "/files/a")), overall: ok, want: ws(limited(ok, 2, minute, 1))},
			{name: "/files/b shares it", descs: ds(desc("path", "/files/b")), overall: ok, want: ws(limited(ok, 2, minute, 0))},
			{name: "/files/c is over", descs: ds(desc("path", "/files/c")), overall: over, want: ws(limited(over, 2, minute, 0))},
			{name: "no wildcard matches", descs: ds(desc("path", "/other")), overall: ok, want: ws(noLimit)},
		}},
		{"replaces drops the replaced limit of the same request", []step{
			{name: "free and paid", descs: ds(desc("plan", "free"), desc("plan", "paid")), overall: ok,
				want: ws(noLimit, limited(ok, 4, year, 3).named("paid"))},
			{name: "free alone was not counted", descs: ds(desc("plan", "free")), overall: ok, want: ws(limited(ok, 2, month, 1).named("free"))},
		}},
		{"unlimited, no policy, unknown domain", []step{
			{name: "unlimited", hits: 1000, descs: ds(desc("internal", "x")), overall: ok, want: ws(unlimited)},
			{name: "no policy", descs: ds(desc("nothing", "x")), overall: ok, want: ws(noLimit)},
			{name: "no entries", descs: ds(desc()), overall: ok, want: ws(noLimit)},
		}},
		{"requests_per_unit 0", []step{
			{name: "a check of a fresh window is OK", descs: ds(addend(desc("blocked", "x"), 0)), overall: ok, want: ws(limited(ok, 0, second, 0))},
			{name: "a hit is over", descs: ds(desc("blocked", "x")), overall: over, want: ws(limited(over, 0, second, 0))},
			{name: "and counted", descs: ds(addend(desc("blocked", "x"), 0)), overall: over, want: ws(limited(over, 0, second, 0))},
		}},
		{"shadow mode reports OK and still counts", []step{
			{name: "first", descs: ds(desc("trial", "x")), overall: ok, want: ws(limited(ok, 1, minute, 0))},
			{name: "over, reported OK", descs: ds(desc("trial", "x")), overall: ok, want: ws(limited(ok, 1, minute, 0))},
		}},
		{"quota mode refuses only when every quota descriptor is over", []step{
			{name: "both fresh", descs: ds(desc("q1", "a"), desc("q2", "a")), overall: ok, want: ws(limited(ok, 1, minute, 0), limited(ok, 1, minute, 0))},
			{name: "one over", descs: ds(desc("q1", "b"), desc("q2", "a")), overall: ok, want: ws(limited(ok, 1, minute, 0), limited(over, 1, minute, 0))},
			{name: "both over", descs: ds(desc("q1", "a"), desc("q2", "a")), overall: over, want: ws(limited(over, 1, minute, 0), limited(over, 1, minute, 0))},
		}},
		{"several descriptors: the most restrictive wins", []step{
			{name: "fill", hits: 2, descs: ds(desc("remote_address", "3.3.3.3")), overall: ok, want: ws(limited(ok, 2, second, 0))},
			{name: "one over", descs: ds(desc("user", "dave"), desc("remote_address", "3.3.3.3"), desc("nothing", "x")), overall: over,
				want: ws(limited(ok, 5, day, 4), limited(over, 2, second, 0), noLimit)},
		}},
		{"hits_addend: request level, and per descriptor overriding it", []step{
			{name: "request level 3", hits: 3, descs: ds(desc("user", "erin")), overall: ok, want: ws(limited(ok, 5, day, 2))},
			{name: "descriptor 1 over request 3", hits: 3, descs: ds(addend(desc("user", "erin"), 1), desc("user", "fay")), overall: ok,
				want: ws(limited(ok, 5, day, 1), limited(ok, 5, day, 2))},
			{name: "over by the addend", hits: 2, descs: ds(desc("user", "erin")), overall: over, want: ws(limited(over, 5, day, 0))},
		}},
		{"per-descriptor limit overrides", []step{
			{name: "override", descs: ds(override(desc("user", "gus"), 1, typepb.RateLimitUnit_MINUTE)), overall: ok, want: ws(limited(ok, 1, minute, 0))},
			{name: "over the override", descs: ds(override(desc("user", "gus"), 1, typepb.RateLimitUnit_MINUTE)), overall: over, want: ws(limited(over, 1, minute, 0))},
			{name: "the policy's own counter is per unit", descs: ds(desc("user", "gus")), overall: ok, want: ws(limited(ok, 5, day, 4))},
			{name: "an override of an entry with no policy", descs: ds(override(desc("nothing", "x"), 7, typepb.RateLimitUnit_HOUR)), overall: ok, want: ws(limited(ok, 7, hour, 6))},
		}},
		{"long units reset on epoch-aligned windows", []step{
			{name: "week", descs: ds(desc("weekly", "x")), overall: ok, want: ws(limited(ok, 1, week, 0))},
			{name: "month", descs: ds(desc("plan", "free")), overall: ok, want: ws(limited(ok, 2, month, 1).named("free"))},
			{name: "a day later", advance: 24 * time.Hour, descs: ds(desc("weekly", "x"), desc("plan", "free")), overall: over,
				want: ws(limited(over, 1, week, 0), limited(ok, 2, month, 0).named("free"))},
		}},
		{"our extensions: algorithm and soft_percent", []step{
			{name: "token bucket", hits: 2, descs: ds(desc("smooth", "x")), overall: ok, want: ws(limited(ok, 2, second, 0).resetIn(1))},
			{name: "refused, not counted", descs: ds(desc("smooth", "x")), overall: over, want: ws(limited(over, 2, second, 0).resetIn(1))},
			{name: "half a second refills one", advance: 500 * time.Millisecond, descs: ds(desc("smooth", "x")), overall: ok, want: ws(limited(ok, 2, second, 0).resetIn(1))},
			{name: "soft: 20% over 10", hits: 12, descs: ds(desc("soft", "x")), overall: ok, want: ws(limited(ok, 12, minute, 0))},
			{name: "soft: the 13th is over", descs: ds(desc("soft", "x")), overall: over, want: ws(limited(over, 12, minute, 0))},
		}},
		{"our extension min_interval_ms: a refusal by the spacing is not counted", []step{
			{name: "first", descs: ds(desc("spaced", "x")), overall: ok, want: ws(limited(ok, 10, minute, 9))},
			{name: "at once: over", descs: ds(desc("spaced", "x")), overall: over, want: ws(limited(over, 10, minute, 0))},
			{name: "a second later: still over", advance: time.Second, descs: ds(desc("spaced", "x")), overall: over, want: ws(limited(over, 10, minute, 0))},
			{name: "2s after the first: the refusals were not counted", advance: time.Second, descs: ds(desc("spaced", "x")), overall: ok,
				want: ws(limited(ok, 10, minute, 8))},
			{name: "another value has its own spacing", descs: ds(desc("spaced", "y")), overall: ok, want: ws(limited(ok, 10, minute, 9))},
		}},
		{"our extension ceiling: a tenant borrows from the policy's parent; refusals are not counted", []step{
			{name: "a's guarantee", descs: ds(desc("tenant", "a")), overall: ok, want: ws(limited(ok, 1, minute, 0))},
			{name: "a borrows", descs: ds(desc("tenant", "a")), overall: ok, want: ws(limited(ok, 1, minute, 0))},
			{name: "a borrows up to its ceiling", descs: ds(desc("tenant", "a")), overall: ok, want: ws(limited(ok, 1, minute, 0))},
			{name: "a at its ceiling", descs: ds(desc("tenant", "a")), overall: over, want: ws(limited(over, 1, minute, 0))},
			{name: "b's guarantee: the parent's last", descs: ds(desc("tenant", "b")), overall: ok, want: ws(limited(ok, 1, minute, 0))},
			{name: "b cannot borrow", descs: ds(desc("tenant", "b")), overall: over, want: ws(limited(over, 1, minute, 0))},
			{name: "a minute later, the next window", advance: time.Minute, descs: ds(desc("tenant", "b")), overall: ok, want: ws(limited(ok, 1, minute, 0))},
			{name: "b borrows", descs: ds(desc("tenant", "b")), overall: ok, want: ws(limited(ok, 1, minute, 0))},
		}},
	}
	for _, seq := range sequences {
		t.Run(seq.name, func(t *testing.T) {
			c := &clock{}
			c.ns.Store(t0.UnixNano())
			client := startRLS(t, "testdata/envoy.yaml", c)
			for _, st := range seq.steps {
				c.advance(st.advance)
				resp, err := client.ShouldRateLimit(t.Context(), &rlspb.RateLimitRequest{Domain: "envoy", Descriptors: st.descs, HitsAddend: st.hits})
				if err != nil {
					t.Fatalf("%s: %v", st.name, err)
				}
				exp := &rlspb.RateLimitResponse{OverallCode: st.overall}
				for _, w := range st.want {
					exp.Statuses = append(exp.Statuses, w.status(c.now()))
				}
				if !proto.Equal(resp, exp) {
					t.Errorf("%s:\n got %v\nwant %v", st.name, resp, exp)
				}
			}
		})
	}
}

// TestShouldRateLimitOtherDomain: a domain no policy file has is
// answered OK with no limit, as envoyproxy/ratelimit answers it, and the
// server says so (policy.UnknownDomains: logged once, counted, listed on
// /status).
func TestShouldRateLimitOtherDomain(t *testing.T) {
	c := &clock{}
	c.ns.Store(t0.UnixNano())
	var told []string
	client := startRLSTelling(t, "testdata/envoy.yaml", c, func(d string) { told = append(told, d) })
	resp, err := client.ShouldRateLimit(t.Context(), &rlspb.RateLimitRequest{Domain: "other",
		Descriptors: ds(desc("user", "alice"), override(desc("user", "alice"), 1, typepb.RateLimitUnit_SECOND))})
	if err != nil {
		t.Fatal(err)
	}
	exp := &rlspb.RateLimitResponse{OverallCode: ok, Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{{Code: ok}, {Code: ok}}}
	if !proto.Equal(resp, exp) {
		t.Errorf("unknown domain: %v", resp)
	}
	if len(told) != 1 || told[0] != "other" {
		t.Errorf("the server was told of %q, want the unknown domain once", told)
	}
}

func TestShouldRateLimitErrors(t *testing.T) {
	c := &clock{}
	c.ns.Store(t0.UnixNano())
	client := startRLS(t, "testdata/envoy.yaml", c)
	many := make([]*commonpb.RateLimitDescriptor, rls.MaxDescriptors+1)
	for i := range many {
		many[i] = desc("user", "x")
	}
	for _, tt := range []struct {
		name string
		req  *rlspb.RateLimitRequest
		want string
	}{
		{"no domain", &rlspb.RateLimitRequest{Descriptors: ds(desc("user", "x"))}, "domain: must not be empty"},
		{"no descriptors", &rlspb.RateLimitRequest{Domain: "envoy"}, "descriptors: must not be empty"},
		{"too many", &rlspb.RateLimitRequest{Domain: "envoy", Descriptors: many}, "descriptors: 1001, at most 1000 allowed"},
		{"unknown unit", &rlspb.RateLimitRequest{Domain: "envoy", Descriptors: ds(override(desc("user", "x"), 1, typepb.RateLimitUnit_UNKNOWN))}, "descriptors[0].limit.unit: UNKNOWN is not a unit"},
		{"override too big", &rlspb.RateLimitRequest{Domain: "envoy", Descriptors: ds(override(desc("user", "x"), math.MaxUint32, typepb.RateLimitUnit_SECOND))}, "descriptors[0].limit.requests_per_unit"},
		{"hits too big", &rlspb.RateLimitRequest{Domain: "envoy", Descriptors: ds(addend(desc("user", "x"), 1<<40))}, "descriptors[0].hits_addend"},
		{"request hits too big", &rlspb.RateLimitRequest{Domain: "envoy", HitsAddend: math.MaxUint32, Descriptors: ds(desc("user", "x"))}, "hits_addend: 4294967295"},
	} {
		_, err := client.ShouldRateLimit(context.Background(), tt.req)
		if s, _ := status.FromError(err); s.Code() != codes.InvalidArgument || s.Message() != tt.want && !hasPrefix(s.Message(), tt.want) {
			t.Errorf("%s: %v, want InvalidArgument %q", tt.name, err, tt.want)
		}
	}
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

// TestWindowMultiplier: a policy of 3 per 30 s (unit second, multiplier
// 30) decides, remaining and reset included, exactly as a native check of
// duration_ms 30,000 beside it on the same clock, for each algorithm a
// policy may name; Envoy is told the window by unit_multiplier.
func TestWindowMultiplier(t *testing.T) {
	for _, algorithm := range []string{"FIXED_WINDOW", "SLIDING_WINDOW", "TOKEN_BUCKET", "LEAKY_BUCKET", "GCRA", "SLIDING_LOG"} {
		t.Run(algorithm, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "w.yaml")
			yaml := "domain: w\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 3, algorithm: " + algorithm + "}\n"
			if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			c := &clock{}
			c.ns.Store(t0.UnixNano())
			policies, err := policy.NewReloader(policy.ReloaderConfig{Path: path})
			if err != nil {
				t.Fatal(err)
			}
			svc := service.New(service.Config{Now: c.now})
			srv := rls.New(rls.Config{Checker: svc, Policies: policies, Now: c.now})
			native := &pb.CheckItem{Name: "native", Key: "k", Limit: 3, DurationMs: 30_000, Algorithm: pb.Algorithm(pb.Algorithm_value[algorithm])}
			// Steps inside a window, across its end, and idle for longer.
			answers := map[rlspb.RateLimitResponse_Code]int{}
			for i, advance := range []time.Duration{0, time.Second, time.Second, 2 * time.Second, 5 * time.Second, 9 * time.Second,
				10 * time.Second, time.Second, 12 * time.Second, 29 * time.Second, 0, 31 * time.Second, 0, 0, 0} {
				c.advance(advance)
				got, err := srv.ShouldRateLimit(t.Context(), &rlspb.RateLimitRequest{Domain: "w", Descriptors: ds(desc("k", "v"))})
				if err != nil {
					t.Fatal(err)
				}
				n, err := svc.Check(t.Context(), &pb.CheckRequest{Requests: []*pb.CheckItem{native}})
				if err != nil {
					t.Fatal(err)
				}
				st, r := got.GetStatuses()[0], n.GetResponses()[0]
				answers[st.GetCode()]++
				wantCode := ok
				if r.GetStatus() == pb.Status_OVER_LIMIT {
					wantCode = over
				}
				wantRemaining := uint32(r.GetRemaining())
				if wantCode == over {
					wantRemaining = 0
				}
				left := max(r.GetResetTimeMs()-c.now().UnixMilli(), 0)
				if st.GetCode() != wantCode || st.GetLimitRemaining() != wantRemaining || st.GetDurationUntilReset().GetSeconds() != (left+999)/1000 {
					t.Errorf("step %d: policy answered %v remaining %d reset in %ds; the native check %v remaining %d reset in %dms",
						i, st.GetCode(), st.GetLimitRemaining(), st.GetDurationUntilReset().GetSeconds(), r.GetStatus(), r.GetRemaining(), left)
				}
				if l := st.GetCurrentLimit(); l.GetUnit() != second || l.GetUnitMultiplier().GetValue() != 30 || l.GetRequestsPerUnit() != 3 {
					t.Errorf("step %d: current_limit %v, want 3 per 30 seconds", i, l)
				}
			}
			if answers[ok] == 0 || answers[over] == 0 {
				t.Errorf("answers %v: the steps should see both OK and OVER_LIMIT", answers)
			}
		})
	}
}

// TestCostKnownAfterwards plays what Envoy sends for a cost known only
// when a response ends (docs/envoy.md): a descriptor's hits_addend of 0
// when the request starts, which checks without charging, and, from a
// rate limit with apply_on_stream_done, the real cost when it ends,
// which a policy with reserve_ttl_ms charges whether or not it fits: the
// token bucket down to empty, the fixed window beyond its limit, as
// envoyproxy/ratelimit counts. A policy without reserve_ttl_ms refuses
// what does not fit, and charges nothing for it.
func TestCostKnownAfterwards(t *testing.T) {
	c := &clock{}
	c.ns.Store(t0.UnixNano())
	client := startRLS(t, "testdata/envoy.yaml", c)
	type step struct {
		name      string
		key       string
		hits      uint64
		code      rlspb.RateLimitResponse_Code
		remaining uint32
	}
	for _, st := range []step{
		{"start: a check of 0", "tokens", 0, ok, 100},
		{"end: 30 tokens", "tokens", 30, ok, 70},
		{"start: 70 left", "tokens", 0, ok, 70},
		{"end: 150, beyond the 70 left, charged down to empty", "tokens", 150, over, 0},
		{"start: not one left, refused", "tokens", 0, over, 0},
		{"fixed window, end: 130 counted beyond 100", "window_tokens", 130, over, 0},
		{"fixed window, start: over", "window_tokens", 0, over, 0},
		{"a policy without reserve_ttl_ms: 2 of 2", "smooth", 2, ok, 0},
		{"its check of 0 with none left: refused", "smooth", 0, over, 0},
	} {
		resp, err := client.ShouldRateLimit(t.Context(), &rlspb.RateLimitRequest{Domain: "envoy", Descriptors: ds(addend(desc(st.key, "alice"), st.hits))})
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if s := resp.Statuses[0]; resp.OverallCode != st.code || s.Code != st.code || s.LimitRemaining != st.remaining {
			t.Errorf("%s: %v, remaining %d; want %v, %d", st.name, s.Code, s.LimitRemaining, st.code, st.remaining)
		}
	}
	// 50 s later (12:01:00.25) the bucket has refilled 83 of its 100: the
	// excess was not carried beyond empty; the fixed window's count starts
	// again with its next minute.
	c.advance(50 * time.Second)
	for _, st := range []step{
		{"the bucket, 50 s later", "tokens", 0, ok, 83},
		{"the window, in its next minute", "window_tokens", 0, ok, 100},
	} {
		resp, err := client.ShouldRateLimit(t.Context(), &rlspb.RateLimitRequest{Domain: "envoy", Descriptors: ds(addend(desc(st.key, "alice"), st.hits))})
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if s := resp.Statuses[0]; s.Code != st.code || s.LimitRemaining != st.remaining {
			t.Errorf("%s: %v, remaining %d; want %v, %d", st.name, s.Code, s.LimitRemaining, st.code, st.remaining)
		}
	}
}
