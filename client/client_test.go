package client_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/api"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/service"
)

// t0 is the fixed clock of the in-process services below.
var t0 = time.UnixMilli(1_700_000_000_000)

func fixedService() *service.Service {
	return service.New(service.Config{Now: func() time.Time { return t0 }})
}

// dialAPI serves svc's gRPC API on a loopback port for the test, and
// returns a client of it; both stop when the test ends.
func dialAPI(t *testing.T, svc *service.Service) *client.Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	api.New(api.Config{Checker: svc, Settler: svc}).RegisterGRPC(srv)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	c, err := client.New(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestAllowOverGRPC(t *testing.T) {
	c := dialAPI(t, service.New(service.Config{}))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l := client.Limit{Name: "api", Count: 1, Period: time.Minute}
	for i, want := range []bool{true, false} {
		if ok, err := c.Allow(ctx, l, "user:42"); ok != want || err != nil {
			t.Errorf("Allow #%d = %v, %v; want %v, nil", i+1, ok, err, want)
		}
	}
	if ok, err := c.Allow(ctx, l, ""); ok || !errors.Is(err, client.ErrInvalid) {
		t.Errorf("Allow with an empty key = %v, %v; want false, ErrInvalid", ok, err)
	}
}

func TestTake(t *testing.T) {
	c := client.Wrap(fixedService())
	ctx := context.Background()
	l := client.Limit{Name: "api", Count: 2, Period: time.Minute}
	for _, tc := range []struct {
		hits int64
		want client.Decision
	}{
		{1, client.Decision{Allowed: true, Limit: 2, Remaining: 1, ResetAt: t0.Add(30 * time.Second)}},
		{0, client.Decision{Allowed: true, Limit: 2, Remaining: 1, ResetAt: t0.Add(30 * time.Second)}},
		{1, client.Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAt: t0.Add(time.Minute)}},
		{1, client.Decision{Allowed: false, Limit: 2, Remaining: 0, ResetAt: t0.Add(time.Minute), RetryAfter: 30 * time.Second}},
		{3, client.Decision{Allowed: false, Limit: 2, Remaining: 0, ResetAt: t0.Add(time.Minute), RetryAfter: client.Never}},
	} {
		d, err := c.Take(ctx, l, "user:42", tc.hits)
		if err != nil || d != tc.want {
			t.Errorf("Take(%d) = %+v, %v\nwant %+v", tc.hits, d, err, tc.want)
		}
	}
}

// TestTakeMinInterval: a Limit with a MinInterval spaces the requests of
// a key, rounded up to the millisecond; without Count and Period it is a
// spacing alone, whose answer's limit is 1.
func TestTakeMinInterval(t *testing.T) {
	c := client.Wrap(fixedService())
	ctx := context.Background()
	spaced := client.Limit{Name: "api", Count: 10, Period: time.Minute, MinInterval: 1500*time.Millisecond - time.Microsecond}
	alone := client.Limit{Name: "login", MinInterval: 2 * time.Second}
	for _, tc := range []struct {
		l    client.Limit
		want client.Decision
	}{
		{spaced, client.Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAt: t0.Add(6 * time.Second)}},
		{spaced, client.Decision{Limit: 10, Remaining: 9, ResetAt: t0.Add(6 * time.Second), RetryAfter: 1500 * time.Millisecond}},
		{alone, client.Decision{Allowed: true, Limit: 1, ResetAt: t0.Add(2 * time.Second)}},
		{alone, client.Decision{Limit: 1, ResetAt: t0.Add(2 * time.Second), RetryAfter: 2 * time.Second}},
	} {
		if d, err := c.Take(ctx, tc.l, "user:42", 1); err != nil || d != tc.want {
			t.Errorf("Take(%+v) = %+v, %v\nwant %+v", tc.l, d, err, tc.want)
		}
	}
	if got := spaced.Item("k", 1).GetMinIntervalMs(); got != 1500 {
		t.Errorf("min_interval_ms of 1.499999s = %d, want 1500: rounded up, never shorter", got)
	}
}

// TestTakeBorrowing: a Limit with a Ceiling and a Parent is admitted
// within Count, then borrows (Decision.Borrowed) while the parent has
// room, up to the ceiling; the parent's Period defaults to the Limit's.
func TestTakeBorrowing(t *testing.T) {
	c := client.Wrap(fixedService())
	ctx := context.Background()
	tenant := client.Limit{Name: "api", Count: 1, Period: time.Minute, Algorithm: client.FixedWindow, Ceiling: 3,
		Parent: client.Parent{Key: "all", Count: 3}}
	window := t0.Truncate(time.Minute).Add(time.Minute) // fixed windows align to the epoch
	for i, tc := range []struct {
		key  string
		want client.Decision
	}{
		{"a", client.Decision{Allowed: true, Limit: 1, ResetAt: window}},
		{"a", client.Decision{Allowed: true, Limit: 1, ResetAt: window, Borrowed: true}},
		{"a", client.Decision{Allowed: true, Limit: 1, ResetAt: window, Borrowed: true}},
		{"a", client.Decision{Limit: 1, ResetAt: window, RetryAfter: window.Sub(t0)}},
		{"b", client.Decision{Allowed: true, Limit: 1, ResetAt: window}},
		{"b", client.Decision{Limit: 1, ResetAt: window, RetryAfter: window.Sub(t0)}},
	} {
		if d, err := c.Take(ctx, tenant, tc.key, 1); err != nil || d != tc.want {
			t.Errorf("check %d of %s = %+v, %v\nwant %+v", i, tc.key, d, err, tc.want)
		}
	}
	if p := tenant.Item("k", 1).GetParent(); p.GetKey() != "all" || p.GetLimit() != 3 || p.GetDurationMs() != 0 {
		t.Errorf("parent on the wire: %v", p)
	}
	if (client.Limit{Name: "api"}).Item("k", 1).Parent != nil {
		t.Error("a Limit without a Parent sent one")
	}
}

func TestTakeLeakyBucketDelay(t *testing.T) {
	c := client.Wrap(fixedService())
	l := client.Limit{Name: "shaped", Count: 10, Period: time.Second, Burst: 5, Algorithm: client.LeakyBucket}
	var delays []time.Duration
	for range 3 {
		d, err := c.Take(context.Background(), l, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		delays = append(delays, d.Delay)
	}
	want := []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond}
	if !slices.Equal(delays, want) {
		t.Errorf("delays %v, want %v", delays, want)
	}
}

// TestTakeInvalid: an invalid check is a Go error naming the field, and a
// refusal, never a nil error with the problem hidden in a result.
func TestTakeInvalid(t *testing.T) {
	c := client.Wrap(fixedService())
	for _, tc := range []struct {
		l     client.Limit
		key   string
		field string
	}{
		{client.Limit{Name: "api", Count: 1, Period: time.Second}, "", "key"},
		{client.Limit{Name: "api", Count: 0, Period: time.Second}, "k", "limit"},
		{client.Limit{Name: "api", Count: 1}, "k", "duration_ms"},
		{client.Limit{Count: 1, Period: time.Second}, "k", "name"},
		{client.Limit{Name: "api", MinInterval: time.Second, Behavior: client.Global}, "k", "min_interval_ms"},
		{client.Limit{Name: "api", Count: 1, Period: time.Second, Ceiling: 2}, "k", "parent"},
		{client.Limit{Name: "api", Count: 1, Period: time.Second, Ceiling: 2, Parent: client.Parent{Count: 9}}, "k", "parent.key"},
	} {
		d, err := c.Take(context.Background(), tc.l, tc.key, 1)
		if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Take(%+v, %q) error = %v, want ErrInvalid naming %s", tc.l, tc.key, err, tc.field)
		}
		if d.Allowed {
			t.Errorf("Take(%+v, %q) allowed an invalid check", tc.l, tc.key)
		}
	}
}

// canned answers every request with resp, or err.
type canned struct {
	resp *pb.CheckResponse
	err  error
}

func (c canned) Check(context.Context, *pb.CheckRequest) (*pb.CheckResponse, error) {
	return c.resp, c.err
}

func TestTakeErrors(t *testing.T) {
	down := errors.New("connection refused")
	l := client.Limit{Name: "api", Count: 1, Period: time.Second}
	for _, tc := range []struct {
		name string
		ch   canned
		want error
	}{
		{"transport", canned{err: down}, down},
		{"no result", canned{resp: &pb.CheckResponse{}}, client.ErrInternal},
		{"unavailable", canned{resp: &pb.CheckResponse{Responses: []*pb.CheckResult{{
			Status: pb.Status_OVER_LIMIT, Error: "shutting down", ErrorCode: pb.ErrorCode_UNAVAILABLE}}}}, client.ErrUnavailable},
		{"internal", canned{resp: &pb.CheckResponse{Responses: []*pb.CheckResult{{
			Status: pb.Status_OVER_LIMIT, Error: "boom", ErrorCode: pb.ErrorCode_INTERNAL}}}}, client.ErrInternal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, err := client.Wrap(tc.ch).Allow(context.Background(), l, "k")
			if ok || !errors.Is(err, tc.want) {
				t.Errorf("Allow = %v, %v; want false, %v", ok, err, tc.want)
			}
		})
	}
}

func TestDecisionOfFallback(t *testing.T) {
	d, err := client.DecisionOf(&pb.CheckResult{
		Status: pb.Status_UNDER_LIMIT, Limit: 6, Remaining: 5, ResetTimeMs: t0.UnixMilli(),
		Metadata: map[string]string{"decided_by": "fallback"},
	})
	want := client.Decision{Allowed: true, Limit: 6, Remaining: 5, ResetAt: t0, DecidedBy: "fallback"}
	if err != nil || d != want {
		t.Errorf("DecisionOf = %+v, %v; want %+v", d, err, want)
	}
}

func TestWrapCloseLeavesCheckerAlone(t *testing.T) {
	if err := client.Wrap(fixedService()).Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
}

// answerer answers every check with one admitted result, and keeps the
// item it was asked, without allocating.
type answerer struct {
	resp *pb.CheckResponse
	got  *pb.CheckItem
}

func (a *answerer) Check(_ context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	a.got = req.GetRequests()[0]
	return a.resp, nil
}

// Take sends its one check as one allocation (the request, its item and
// its hits together), and the item is the one Limit.Item builds.
func TestTakeAllocatesItsRequestOnce(t *testing.T) {
	a := &answerer{resp: &pb.CheckResponse{Responses: []*pb.CheckResult{{Status: pb.Status_UNDER_LIMIT}}}}
	c := client.Wrap(a)
	l := client.Limit{Name: "api", Count: 10, Period: time.Minute, Burst: 3, MinInterval: 1500 * time.Microsecond,
		Parent: client.Parent{Key: "all", Count: 100}}
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() { c.Take(ctx, l, "user:1", 2) }); n != 2 {
		t.Errorf("Take allocates %v times, want 2 (its request; the item's parent)", n)
	}
	if want := l.Item("user:1", 2); !proto.Equal(a.got, want) {
		t.Errorf("Take sent %v, want Limit.Item's %v", a.got, want)
	}
}
