package rlqs_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/policy"
	"github.com/ringlimit/ringlimit/rlqs"
)

// policies nest their keys in sorted order, as a bucket_id's entries are
// matched.
const policies = `
domain: edge
descriptors:
  - key: path
    value: /api
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 1000}
  - key: path
    value: /closed
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 0}
  - key: path
    value: /free
    descriptors:
      - key: tenant
        rate_limit: {unlimited: true}
  - key: path
    value: /spaced
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 10, min_interval_ms: 100}
`

type fixedPolicies struct{ set *policy.Set }

func (p fixedPolicies) Policies() *policy.Set { return p.set }

func loadPolicies(t *testing.T) fixedPolicies {
	t.Helper()
	path := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(path, []byte(policies), 0o600); err != nil {
		t.Fatal(err)
	}
	set, err := policy.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return fixedPolicies{set}
}

// leaser is an owner that lends each stream a share of lend hits a
// second and a tenth of that in burst (at least one), and remembers the
// reports.
type leaser struct {
	mu      sync.Mutex
	lend    int64
	fail    bool
	reports []*pb.LeaseReport
	secrets map[string]bool
}

func (l *leaser) Lease(ctx context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.secrets == nil {
		l.secrets = map[string]bool{}
	}
	l.secrets[string(req.GetLessee())] = true
	if l.fail {
		return nil, status.Error(codes.Unavailable, "owner unreachable")
	}
	out := &pb.LeaseResponse{}
	for _, r := range req.GetReports() {
		l.reports = append(l.reports, proto.Clone(r).(*pb.LeaseReport))
		g := &pb.LeaseGrant{Epoch: r.GetEpoch(), Granted: r.GetAdmitted(), Acked: r.GetAdmitted(), TtlMs: 2000}
		if l.lend > 0 {
			g.ShareRateMilli, g.ShareBurst = l.lend*1000, max(1, l.lend/10)
		}
		out.Grants = append(out.Grants, g)
	}
	return out, nil
}

func (l *leaser) last() *pb.LeaseReport {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.reports) == 0 {
		return nil
	}
	return l.reports[len(l.reports)-1]
}

func (l *leaser) set(lend int64, fail bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lend, l.fail = lend, fail
}

// serve runs a Server with bounds b on loopback and returns it and a
// client of it.
func serve(t *testing.T, l *leaser, b rlqs.Bounds) (*rlqs.Server, rlqspb.RateLimitQuotaServiceClient) {
	t.Helper()
	s, err := rlqs.New(rlqs.Config{Leaser: l, Policies: loadPolicies(t), Bounds: b})
	if err != nil {
		t.Fatal(err)
	}
	return s, serveOn(t, s)
}

// rlqsRefused is ringlimit_rlqs_refused_total{reason} of reg.
func rlqsRefused(t *testing.T, reg *prometheus.Registry, reason string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
	for _, mf := range mfs {
		if mf.GetName() != "ringlimit_rlqs_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == reason {
				c.Add(m.GetCounter().GetValue())
			}
		}
	}
	return c
}

// serveOn runs s on loopback and returns a client of it.
func serveOn(t *testing.T, s *rlqs.Server) rlqspb.RateLimitQuotaServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	s.Register(srv)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return rlqspb.NewRateLimitQuotaServiceClient(cc)
}

func open(t *testing.T, c rlqspb.RateLimitQuotaServiceClient) rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	st, err := c.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func usage(allowed, denied uint64, kv ...string) *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
	id := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		id[kv[i]] = kv[i+1]
	}
	return &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqspb.BucketId{Bucket: id},
		TimeElapsed: durationpb.New(0), NumRequestsAllowed: allowed, NumRequestsDenied: denied}
}

func send(t *testing.T, st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient, domain string, us ...*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage) {
	t.Helper()
	if err := st.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: us}); err != nil {
		t.Fatal(err)
	}
}

func recv(t *testing.T, st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient) *rlqspb.RateLimitQuotaResponse {
	t.Helper()
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	return resp
}

// sendToRefused sends a report on a stream the server may already have
// refused: gRPC's Send then says io.EOF and Recv has the status, so the
// caller's Recv is what the test judges.
func sendToRefused(t *testing.T, st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient, domain string, us ...*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage) {
	t.Helper()
	if err := st.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: us}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("send: %v, want it sent or io.EOF", err)
	}
}

func only(t *testing.T, resp *rlqspb.RateLimitQuotaResponse) *rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction {
	t.Helper()
	if len(resp.GetBucketAction()) != 1 || resp.GetBucketAction()[0].GetQuotaAssignmentAction() == nil {
		t.Fatalf("response %v: want one assignment", resp)
	}
	return resp.GetBucketAction()[0].GetQuotaAssignmentAction()
}

// TestSubscribeAssignRenew: the first report of a bucket subscribes it,
// as a share report of the policy's counter with what the Envoy admitted
// already; the answer is the share as a token bucket (max_tokens the
// burst, tokens_per_fill the rate per the fixed fill interval), for the
// time-to-live, renewed unchanged while the share is (by the Envoy's
// reports and, between them, every half time-to-live); a changed share
// is a changed token bucket, and the next report claims it.
func TestSubscribeAssignRenew(t *testing.T) {
	l := &leaser{lend: 100}
	_, c := serve(t, l, rlqs.Bounds{})
	st := open(t, c)
	send(t, st, "edge", usage(3, 0, "tenant", "a", "path", "/api"))
	a := only(t, recv(t, st))
	rep := l.last()
	if rep.GetItem().GetName() != "rlqs/SECOND" || rep.GetItem().GetKey() != "edge_path_/api_tenant_a_" || rep.GetItem().GetLimit() != 1000 ||
		!rep.GetShare() || rep.GetAdmitted() != 3 || rep.GetAsked() != 3 || rep.GetShareRateMilli() != 0 || rep.GetEpoch() != 1 {
		t.Fatalf("lease report %v: want a share report of the policy's counter, entries in key order, admitted 3", rep)
	}
	tb := a.GetRateLimitStrategy().GetTokenBucket()
	if a.GetAssignmentTimeToLive().AsDuration() != time.Second || tb.GetMaxTokens() != 10 || tb.GetTokensPerFill().GetValue() != 6000 ||
		tb.GetFillInterval().AsDuration() != time.Minute {
		t.Fatalf("assignment %v: want a token bucket of 10, refilled 100 a second (6000 a minute), for 1s", a)
	}
	// Between reports: renewed unchanged before it runs out.
	r := only(t, recv(t, st))
	if !proto.Equal(r.GetRateLimitStrategy(), a.GetRateLimitStrategy()) || r.GetAssignmentTimeToLive().AsDuration() != time.Second {
		t.Fatalf("renewal %v: want %v again", r, a)
	}
	// The owner changes the share: a changed token bucket.
	l.set(300, false)
	send(t, st, "", usage(40, 7, "path", "/api", "tenant", "a"))
	n := only(t, recv(t, st)).GetRateLimitStrategy().GetTokenBucket()
	if n.GetMaxTokens() != 30 || n.GetTokensPerFill().GetValue() != 18000 {
		t.Fatalf("after the share changed: %v, want a token bucket of 30, refilled 300 a second", n)
	}
	if rep := l.last(); rep.GetAdmitted() != 43 || rep.GetAsked() != 50 || rep.GetShareRateMilli() != 100_000 || rep.GetShareBurst() != 10 {
		t.Fatalf("lease report %v: want running totals, and the share held claimed", rep)
	}
}

// TestNothingLentDenies: an owner that lends nothing beyond what was
// reported gets DENY_ALL; an owner that cannot be asked, no assignment
// at all (the one in force runs out).
func TestNothingLentDenies(t *testing.T) {
	l := &leaser{lend: 0}
	_, c := serve(t, l, rlqs.Bounds{})
	st := open(t, c)
	send(t, st, "edge", usage(1, 0, "tenant", "a", "path", "/api"))
	if a := only(t, recv(t, st)); a.GetRateLimitStrategy().GetBlanketRule() != typepb.RateLimitStrategy_DENY_ALL {
		t.Fatalf("nothing lent: %v, want DENY_ALL", a)
	}
	l.set(0, true)
	send(t, st, "", usage(0, 5, "tenant", "a", "path", "/api"))
	l.set(50, false)
	send(t, st, "", usage(0, 5, "tenant", "a", "path", "/api"))
	// The failed round sends nothing: the next answer is the second report's.
	if a := only(t, recv(t, st)); a.GetRateLimitStrategy().GetTokenBucket() == nil {
		t.Fatalf("after a failed lease round and one that lends: %v, want a token bucket", a)
	}
}

// TestFixedBuckets: a bucket no policy matches, or an unlimited one, is
// ALLOW_ALL; requests_per_unit 0 is DENY_ALL; a policy that cannot be
// lent (min_interval_ms) gets no assignment. None is leased.
func TestFixedBuckets(t *testing.T) {
	l := &leaser{lend: 10}
	_, c := serve(t, l, rlqs.Bounds{})
	st := open(t, c)
	send(t, st, "edge", usage(1, 0, "tenant", "a", "path", "/spaced"), usage(1, 0, "tenant", "a", "path", "/free"),
		usage(1, 0, "tenant", "a", "path", "/closed"), usage(1, 0, "other", "x"))
	got := map[string]typepb.RateLimitStrategy_BlanketRule{}
	for _, a := range recv(t, st).GetBucketAction() {
		got[a.GetBucketId().GetBucket()["path"]+a.GetBucketId().GetBucket()["other"]] = a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule()
	}
	want := map[string]typepb.RateLimitStrategy_BlanketRule{"/free": typepb.RateLimitStrategy_ALLOW_ALL, "/closed": typepb.RateLimitStrategy_DENY_ALL, "x": typepb.RateLimitStrategy_ALLOW_ALL}
	if len(got) != len(want) || got["/free"] != want["/free"] || got["/closed"] != want["/closed"] || got["x"] != want["x"] {
		t.Fatalf("assignments %v, want %v (and none for /spaced)", got, want)
	}
	if l.last() != nil {
		t.Fatalf("lease report %v: want none for these buckets", l.last())
	}
}

// TestAbandon: a bucket reported without a request AbandonAfter times in
// a row is abandoned; its next report subscribes it again, as a new
// account epoch.
func TestAbandon(t *testing.T) {
	l := &leaser{lend: 10}
	_, c := serve(t, l, rlqs.Bounds{AbandonAfter: 3})
	st := open(t, c)
	send(t, st, "edge", usage(1, 0, "tenant", "a", "path", "/api"))
	only(t, recv(t, st))
	abandoned := false
	for range 3 {
		send(t, st, "", usage(0, 0, "tenant", "a", "path", "/api"))
		for _, a := range recv(t, st).GetBucketAction() {
			abandoned = abandoned || a.GetAbandonAction() != nil
		}
	}
	if !abandoned {
		t.Fatal("three idle reports: no AbandonAction")
	}
	send(t, st, "", usage(1, 0, "tenant", "a", "path", "/api"))
	for {
		if a := recv(t, st).GetBucketAction(); len(a) == 1 && a[0].GetQuotaAssignmentAction() != nil && l.last().GetEpoch() == 2 {
			break
		}
	}
}

// TestBadInput: a message whose domain or size breaks a rule ends its
// stream with a status naming the field; nothing is lent for it.
func TestBadInput(t *testing.T) {
	big := make([]*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage, rlqs.MaxUsagesPerMessage+1)
	for i := range big {
		big[i] = usage(1, 0, "tenant", strings.Repeat("x", i+1))
	}
	for _, tc := range []struct {
		name   string
		first  *rlqspb.RateLimitQuotaUsageReports // nil: a good one first
		bad    *rlqspb.RateLimitQuotaUsageReports
		code   codes.Code
		reason string
	}{
		{"no domain", nil, &rlqspb.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(1, 0, "a", "b")}}, codes.InvalidArgument, "domain: must not be empty"},
		{"unknown domain", nil, &rlqspb.RateLimitQuotaUsageReports{Domain: "nope"}, codes.NotFound, `domain: "nope"`},
		{"domain changed", &rlqspb.RateLimitQuotaUsageReports{Domain: "edge"}, &rlqspb.RateLimitQuotaUsageReports{Domain: "other"}, codes.InvalidArgument, "domain: \"other\", but the stream's is \"edge\""},
		{"too many usages", nil, &rlqspb.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: big}, codes.InvalidArgument, "bucket_quota_usages: 1001, at most 1000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &leaser{lend: 10}
			_, c := serve(t, l, rlqs.Bounds{})
			st := open(t, c)
			if tc.first != nil {
				if err := st.Send(tc.first); err != nil {
					t.Fatal(err)
				}
			}
			if err := st.Send(tc.bad); err != nil {
				t.Fatal(err)
			}
			_, err := st.Recv()
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.reason) {
				t.Fatalf("got %v, want %v naming %q", err, tc.code, tc.reason)
			}
			if l.last() != nil {
				t.Fatalf("lease report %v for a refused message", l.last())
			}
		})
	}
}

// TestBadBucketKeepsStream is the bad bucket of issue 35: a usage that
// breaks a rule (a bucket_id value of 300 bytes, an empty one, too many
// entries, a bad time_elapsed or count, a bucket twice) is ignored and
// counted, and the stream and its other buckets are served, again at each
// of the Envoy's reports, which carry the bad bucket every time.
func TestBadBucketKeepsStream(t *testing.T) {
	many := map[string]string{}
	for i := range rlqs.MaxEntries + 1 {
		many[fmt.Sprint("k", i)] = "v"
	}
	for _, tc := range []struct {
		name   string
		bad    *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
		reason string
	}{
		{"a value of 300 bytes", usage(1, 0, "tenant", strings.Repeat("v", 300), "path", "/api"), "at most 256 allowed"},
		{"no bucket_id", &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{NumRequestsAllowed: 1}, "bucket_id: missing"},
		{"an empty bucket", usage(1, 0), "bucket: must not be empty"},
		{"an empty key", usage(1, 0, "", "v"), "a key must not be empty"},
		{"an empty value", usage(1, 0, "k", ""), "the value must not be empty"},
		{"too many entries", &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqspb.BucketId{Bucket: many}}, "entries, at most"},
		{"a negative time_elapsed", &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqspb.BucketId{Bucket: map[string]string{"k": "v"}}, TimeElapsed: durationpb.New(-time.Second)}, "time_elapsed"},
		{"over-reporting", usage(rlqs.MaxRequestsPerReport+1, 0, "k", "v"), "num_requests_allowed"},
		{"the good bucket twice", usage(1, 0, "tenant", "a", "path", "/api"), "the same bucket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &leaser{lend: 10}
			reg := prometheus.NewRegistry()
			s, err := rlqs.New(rlqs.Config{Leaser: l, Policies: loadPolicies(t), Registerer: reg})
			if err != nil {
				t.Fatal(err)
			}
			c := serveOn(t, s)
			st := open(t, c)
			for round := range 3 { // the first report, and the Envoy's re-reports
				domain := ""
				if round == 0 {
					domain = "edge"
				}
				send(t, st, domain, usage(1, 0, "tenant", "a", "path", "/api"), tc.bad)
				a := only(t, recv(t, st))
				if a.GetRateLimitStrategy().GetTokenBucket() == nil {
					t.Fatalf("report %d: the good bucket got %v, want its token bucket", round, a)
				}
			}
			if got := testutil.ToFloat64(rlqsRefused(t, reg, "invalid_bucket")); got != 3 {
				t.Errorf("ringlimit_rlqs_refused_total{reason=\"invalid_bucket\"} = %v, want 3", got)
			}
		})
	}
}

// TestBounds: streams beyond MaxStreams are refused RESOURCE_EXHAUSTED;
// buckets beyond MaxBucketsPerStream are abandoned (so that Envoy forgets
// them; no account), the others served; thousands of them in one message
// cost one lease call.
func TestBounds(t *testing.T) {
	l := &leaser{lend: 10}
	_, c := serve(t, l, rlqs.Bounds{MaxStreams: 2, MaxBucketsPerStream: 3})
	a, b := open(t, c), open(t, c)
	send(t, a, "edge", usage(1, 0, "tenant", "1", "path", "/api"), usage(1, 0, "tenant", "2", "path", "/api"),
		usage(1, 0, "tenant", "3", "path", "/api"), usage(1, 0, "tenant", "4", "path", "/api"), usage(1, 0, "tenant", "5", "path", "/api"))
	assigned, abandoned := 0, 0
	for _, act := range recv(t, a).GetBucketAction() {
		switch {
		case act.GetQuotaAssignmentAction() != nil:
			assigned++
		case act.GetAbandonAction() != nil:
			abandoned++
		}
	}
	if assigned != 3 || abandoned != 2 {
		t.Fatalf("5 buckets, at most 3 a stream: %d assignments and %d abandoned, want 3 and 2", assigned, abandoned)
	}
	send(t, b, "edge", usage(1, 0, "tenant", "1", "path", "/api"))
	recv(t, b)
	third := open(t, c)
	sendToRefused(t, third, "edge", usage(1, 0, "k", "v"))
	if _, err := third.Recv(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--rlqs-max-streams") {
		t.Fatalf("third stream: %v, want RESOURCE_EXHAUSTED naming --rlqs-max-streams", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.secrets) != 2 {
		t.Fatalf("%d lessee secrets, want one a stream", len(l.secrets))
	}
}

// TestDrainZeroTTL: Drain sends every assignment in force again with a
// zero time-to-live, then ends the stream UNAVAILABLE; the server
// refuses new streams.
func TestDrainZeroTTL(t *testing.T) {
	l := &leaser{lend: 10}
	s, c := serve(t, l, rlqs.Bounds{})
	st := open(t, c)
	send(t, st, "edge", usage(1, 0, "tenant", "a", "path", "/api"), usage(1, 0, "tenant", "a", "path", "/free"))
	if n := len(recv(t, st).GetBucketAction()); n != 2 {
		t.Fatalf("%d assignments, want 2", n)
	}
	done := make(chan struct{})
	go func() { s.Drain(context.Background()); close(done) }()
	zero := 0
	for {
		resp, err := st.Recv()
		if err != nil {
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("stream ended %v, want UNAVAILABLE", err)
			}
			break
		}
		for _, a := range resp.GetBucketAction() {
			if q := a.GetQuotaAssignmentAction(); q != nil && q.GetAssignmentTimeToLive() != nil && q.GetAssignmentTimeToLive().AsDuration() == 0 {
				zero++
			}
		}
	}
	if zero != 2 {
		t.Fatalf("%d zero time-to-live assignments, want 2", zero)
	}
	<-done
	next := open(t, c)
	sendToRefused(t, next, "edge", usage(1, 0, "k", "v"))
	if _, err := next.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("a stream after Drain: %v, want UNAVAILABLE", err)
	}
}

// TestBoundsChecked: out-of-range bounds are refused naming the flag,
// and an assignment time-to-live too long for the lease time-to-live
// refuses streams, naming both flags.
func TestBoundsChecked(t *testing.T) {
	for _, b := range []rlqs.Bounds{{AssignmentTTL: 1500 * time.Millisecond}, {MaxBucketsPerStream: 1001}} {
		if _, err := rlqs.New(rlqs.Config{Bounds: b}); err == nil || !strings.Contains(err.Error(), "--rlqs-") {
			t.Errorf("%+v: %v, want an error naming the flag", b, err)
		}
	}
	s, err := rlqs.New(rlqs.Config{Leaser: &leaser{}, Policies: loadPolicies(t), LeaseTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	s.Register(srv)
	go srv.Serve(lis)
	defer srv.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	st := open(t, rlqspb.NewRateLimitQuotaServiceClient(cc))
	sendToRefused(t, st, "edge")
	if _, err := st.Recv(); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--lease-ttl") {
		t.Fatalf("lease TTL 1s, assignment TTL 1s: %v, want FAILED_PRECONDITION naming --lease-ttl", err)
	}
}
