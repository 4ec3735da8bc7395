package grpclimit_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/grpclimit"
	"github.com/ringlimit/ringlimit/service"
)

var (
	t0           = time.UnixMilli(1_700_000_000_000)
	twoPerMinute = client.Limit{Name: "api", Count: 2, Period: time.Minute}
)

// fixedNode is a one-node service in process with its clock at t0.
func fixedNode() *client.Client {
	return client.Wrap(service.New(service.Config{Now: func() time.Time { return t0 }}))
}

// serveHealth starts a real gRPC server on 127.0.0.1, limited by l, with
// the health service (a unary Check and a streaming Watch) behind it, and
// returns a client of it.
func serveHealth(t *testing.T, l *grpclimit.Limiter) healthpb.HealthClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(l.Unary), grpc.ChainStreamInterceptor(l.Stream))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// retryDelay is the RetryInfo delay in err's status, or -1 without one.
func retryDelay(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return -1
}

func TestUnary(t *testing.T) {
	hc := serveHealth(t, &grpclimit.Limiter{Client: fixedNode(), Limit: twoPerMinute})
	ctx := ctxT(t)
	var errs []error
	for range 3 {
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		errs = append(errs, err)
	}
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("first two calls: %v, %v; want both through", errs[0], errs[1])
	}
	if code := status.Code(errs[2]); code != codes.ResourceExhausted {
		t.Fatalf("third call: %v, want RESOURCE_EXHAUSTED", errs[2])
	}
	if got := retryDelay(errs[2]); got != 30*time.Second {
		t.Errorf("RetryInfo delay %v, want 30s (one token of 2/min)", got)
	}
}

func TestStreamCheckedOnceWhenItOpens(t *testing.T) {
	hc := serveHealth(t, &grpclimit.Limiter{Client: fixedNode(), Limit: client.Limit{Name: "watch", Count: 1, Period: time.Minute}})
	ctx := ctxT(t)
	first, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Recv(); err != nil {
		t.Fatalf("first stream: %v, want a message", err)
	}
	second, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = second.Recv()
	if status.Code(err) != codes.ResourceExhausted || retryDelay(err) != time.Minute {
		t.Errorf("second stream: %v (retry %v), want RESOURCE_EXHAUSTED with a 1m RetryInfo", err, retryDelay(err))
	}
}

func TestKeyFromMetadata(t *testing.T) {
	var methods []string
	l := &grpclimit.Limiter{Client: fixedNode(), Limit: client.Limit{Name: "api", Count: 1, Period: time.Minute},
		Key: func(_ context.Context, method string, md metadata.MD) string {
			methods = append(methods, method)
			if v := md.Get("x-user"); len(v) > 0 {
				return "user:" + v[0]
			}
			return "" // exempt
		}}
	hc := serveHealth(t, l)
	ctx := ctxT(t)
	call := func(user string) codes.Code {
		c := ctx
		if user != "" {
			c = metadata.AppendToOutgoingContext(ctx, "x-user", user)
		}
		_, err := hc.Check(c, &healthpb.HealthCheckRequest{})
		return status.Code(err)
	}
	got := []codes.Code{call("ann"), call("ann"), call("bob"), call(""), call("")}
	want := []codes.Code{codes.OK, codes.ResourceExhausted, codes.OK, codes.OK, codes.OK}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("codes %v, want %v (keyed by user, none exempt)", got, want)
			break
		}
	}
	if methods[0] != "/grpc.health.v1.Health/Check" {
		t.Errorf("Key saw method %q", methods[0])
	}
}

func TestNeverHasNoRetryInfo(t *testing.T) {
	hc := serveHealth(t, &grpclimit.Limiter{Client: fixed{d: client.Decision{RetryAfter: client.Never}}, Limit: twoPerMinute})
	_, err := hc.Check(ctxT(t), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.ResourceExhausted || retryDelay(err) != -1 {
		t.Errorf("%v (retry %v), want RESOURCE_EXHAUSTED without RetryInfo", err, retryDelay(err))
	}
}

// fixed answers every check with d, or err.
type fixed struct {
	d   client.Decision
	err error
}

func (f fixed) Take(context.Context, client.Limit, string, int64) (client.Decision, error) {
	return f.d, f.err
}

func TestWhenRingLimitIsDown(t *testing.T) {
	down := errors.New("unreachable")
	var hooked error
	for _, tc := range []struct {
		name string
		l    grpclimit.Limiter
		want codes.Code
	}{
		{"fail closed", grpclimit.Limiter{Client: fixed{err: down}, Limit: twoPerMinute}, codes.Unavailable},
		{"fail open", grpclimit.Limiter{Client: fixed{err: down}, Limit: twoPerMinute, FailOpen: true}, codes.OK},
		{"hook decides", grpclimit.Limiter{Client: fixed{err: down}, Limit: twoPerMinute, FailOpen: true,
			ErrorHandler: func(_ context.Context, _ string, err error) error {
				hooked = err
				return status.Error(codes.Aborted, "limiter: "+err.Error())
			}}, codes.Aborted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hc := serveHealth(t, &tc.l)
			_, err := hc.Check(ctxT(t), &healthpb.HealthCheckRequest{})
			if status.Code(err) != tc.want {
				t.Errorf("%v, want %v", err, tc.want)
			}
		})
	}
	if !errors.Is(hooked, down) {
		t.Errorf("ErrorHandler got %v, want the checker's error", hooked)
	}
}
