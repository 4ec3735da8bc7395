package admit

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

const max = 3

// blocker is a checker that holds every request until release is closed,
// telling entered of each.
type blocker struct {
	pb.UnimplementedRateLimiterServer
	entered chan struct{}
	release chan struct{}
}

func newBlocker() *blocker {
	return &blocker{entered: make(chan struct{}, max+1), release: make(chan struct{})}
}

func (b *blocker) wait() {
	b.entered <- struct{}{}
	<-b.release
}

func (b *blocker) Check(context.Context, *pb.CheckRequest) (*pb.CheckResponse, error) {
	b.wait()
	return &pb.CheckResponse{}, nil
}

func (b *blocker) ServeHTTP(w http.ResponseWriter, _ *http.Request) { b.wait() }

func TestHTTPRefusesBeyondMax(t *testing.T) {
	g := New(Config{Max: max})
	b := newBlocker()
	h := g.HTTP(b)
	var wg sync.WaitGroup
	for range max {
		wg.Go(func() { h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/v1/check", nil)) })
		<-b.entered
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/check", nil)) // returns at once, or the test hangs
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" || !strings.Contains(rec.Body.String(), "overloaded") {
		t.Errorf("request %d of %d: %d Retry-After %q %s, want 503, Retry-After 1 and an error", max+1, max, rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
	if n := testutil.ToFloat64(g.refused.WithLabelValues("http")); n != 1 {
		t.Errorf("ringlimit_overload_rejected_total{interface=http} = %v, want 1", n)
	}
	close(b.release)
	wg.Wait()
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/check", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("after the others finished: %d, want 200", rec.Code)
	}
}

func TestGRPCRefusesBeyondMax(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := New(Config{Max: max, Registerer: reg})
	b := newBlocker()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.InTapHandle(g.Tap))
	pb.RegisterRateLimiterServer(srv, b)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rl := pb.NewRateLimiterClient(conn)
	ctx := context.Background()

	var wg sync.WaitGroup
	for range max {
		wg.Go(func() {
			if _, err := rl.Check(ctx, &pb.CheckRequest{}); err != nil {
				t.Errorf("admitted check: %v", err)
			}
		})
		<-b.entered
	}
	_, err = rl.Check(ctx, &pb.CheckRequest{}) // returns at once, or the test hangs
	st := status.Convert(err)
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			retry = ri
		}
	}
	if st.Code() != codes.ResourceExhausted || retry.GetRetryDelay().AsDuration() <= 0 {
		t.Errorf("check %d of %d: %v (details %v), want ResourceExhausted with RetryInfo", max+1, max, err, st.Details())
	}
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health check while full: %v, want it answered", err)
	}
	if n := testutil.ToFloat64(g.refused.WithLabelValues("grpc")); n != 1 {
		t.Errorf("ringlimit_overload_rejected_total{interface=grpc} = %v, want 1", n)
	}
	close(b.release)
	wg.Wait()
	// Slots come back when the RPCs' contexts end, just after they answer.
	for deadline := time.Now().Add(10 * time.Second); len(g.slots) > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d slots still taken 10s after the RPCs finished", len(g.slots))
		}
	}
	if _, err := rl.Check(ctx, &pb.CheckRequest{}); err != nil {
		t.Errorf("after the others finished: %v", err)
	}
}

// TestStreamsAndTheirRequests: a call of a Streams method takes a stream
// slot, not a request slot, beyond MaxStreams it is refused, and its slot
// comes back when it ends; each request on it takes a request slot
// through Message, refused beyond Max and counted as grpc_stream.
func TestStreamsAndTheirRequests(t *testing.T) {
	const method = "/ringlimit.v1.RateLimiter/CheckStream"
	g := New(Config{Max: 2, Streams: []string{method}, MaxStreams: 1})
	open := func(name string) (context.CancelFunc, error) {
		ctx, cancel := context.WithCancel(context.Background())
		_, err := g.Tap(ctx, &tap.Info{FullMethodName: name})
		return cancel, err
	}
	endStream, err := open(method)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open(method); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a stream beyond MaxStreams: %v, want RESOURCE_EXHAUSTED", err)
	}
	var ends []context.CancelFunc
	for range 2 { // the open stream holds no request slot
		end, err := open("/ringlimit.v1.RateLimiter/Check")
		if err != nil {
			t.Fatalf("a call beside an open stream: %v", err)
		}
		ends = append(ends, end)
	}
	if _, err := g.Message(100); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a stream's request with every slot taken: %v, want RESOURCE_EXHAUSTED", err)
	}
	if n := testutil.ToFloat64(g.refused.WithLabelValues("grpc_stream")); n != 1 {
		t.Errorf("ringlimit_overload_rejected_total{interface=grpc_stream} = %v, want 1", n)
	}
	for _, end := range ends {
		end()
	}
	for deadline := time.Now().Add(10 * time.Second); len(g.slots) > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("request slots not given back")
		}
	}
	done, err := g.Message(100)
	if err != nil {
		t.Fatalf("a stream's request with slots free: %v", err)
	}
	done()
	endStream()
	for deadline := time.Now().Add(10 * time.Second); len(g.streams) > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stream slot was not given back when the stream ended")
		}
	}
	if end, err := open(method); err != nil {
		t.Errorf("a stream once the other ended: %v", err)
	} else {
		end()
	}
}

// TestPoolsApart: a method of Config.Pools is bounded by its own pool, and
// neither takes nor is refused by the slots of requests and of
// Config.Streams: quota streams cannot keep CheckStreams out.
func TestPoolsApart(t *testing.T) {
	const stream, quota = "/ringlimit.v1.RateLimiter/CheckStream", "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
	g := New(Config{Max: 1, Streams: []string{stream}, MaxStreams: 1, Pools: map[string]int{quota: 2}})
	open := func(name string) (context.CancelFunc, error) {
		ctx, cancel := context.WithCancel(context.Background())
		_, err := g.Tap(ctx, &tap.Info{FullMethodName: name})
		return cancel, err
	}
	var ends []context.CancelFunc
	for i := range 2 {
		end, err := open(quota)
		if err != nil {
			t.Fatalf("quota stream %d of a pool of 2: %v", i, err)
		}
		ends = append(ends, end)
	}
	if _, err := open(quota); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a quota stream beyond its pool: %v, want RESOURCE_EXHAUSTED", err)
	}
	for _, name := range []string{stream, "/ringlimit.v1.RateLimiter/Check"} {
		end, err := open(name)
		if err != nil {
			t.Errorf("%s with the quota pool full: %v", name, err)
			continue
		}
		ends = append(ends, end)
	}
	for _, end := range ends {
		end()
	}
	for deadline := time.Now().Add(10 * time.Second); len(g.pools[quota]) > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the quota pool's slots were not given back when the streams ended")
		}
	}
}

// TestHTTPRefusesBeyondBytes: with MaxBytes, requests are accounted at
// RequestBytes of their body's length (the longest body when it is not
// known) and one that would go beyond the bound is refused with 503 and
// an error naming --memory-limit, however few requests are in flight.
func TestHTTPRefusesBeyondBytes(t *testing.T) {
	const body = 1 << 20
	g := New(Config{Max: 100, MaxBytes: 2 * RequestBytes(body, body), MaxBodyBytes: body})
	b := newBlocker()
	h := g.HTTP(b)
	post := func(n int64) *http.Request {
		r := httptest.NewRequest("POST", "/v1/check", nil)
		r.ContentLength = n
		return r
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { h.ServeHTTP(httptest.NewRecorder(), post(body)) })
		<-b.entered
	}
	for _, n := range []int64{1, -1} { // a small body, and one of unknown length
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, post(n))
		if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "--memory-limit") {
			t.Errorf("a body of %d bytes beyond the bytes in flight: %d %s, want 503 naming --memory-limit", n, rec.Code, rec.Body)
		}
	}
	close(b.release)
	wg.Wait()
	if g.bytes.used.Load() != 0 {
		t.Errorf("%d bytes still accounted once every request finished", g.bytes.used.Load())
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, post(1))
	if rec.Code != http.StatusOK {
		t.Errorf("after the others finished: %d, want 200", rec.Code)
	}
}

// serveAnswerer serves answerer on loopback with opts until tb ends, and
// returns a client of it.
func serveAnswerer(tb testing.TB, opts ...grpc.ServerOption) pb.RateLimiterClient {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	pb.RegisterRateLimiterServer(srv, answerer{})
	go srv.Serve(lis)
	tb.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return pb.NewRateLimiterClient(conn)
}

// answerer answers every check at once.
type answerer struct {
	pb.UnimplementedRateLimiterServer
}

func (answerer) Check(context.Context, *pb.CheckRequest) (*pb.CheckResponse, error) {
	return &pb.CheckResponse{}, nil
}

// TestGRPCCountsRealSize: a unary call is accounted at its message's real
// size once the message has arrived (ServerOptions), so a call whose
// message does not fit the bytes in flight is refused RESOURCE_EXHAUSTED,
// naming --memory-limit, before its handler runs, while small calls pass,
// and every byte comes back when the calls end. On main a call was
// accounted at a fixed CallBytes (64 KiB) whatever its size: the 600 KB
// call was admitted.
func TestGRPCCountsRealSize(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := New(Config{Max: max, MaxBytes: 1 << 20, CallBytes: 64 << 10, Registerer: reg})
	rl := serveAnswerer(t, append(g.ServerOptions(), grpc.InTapHandle(g.Tap))...)
	ctx := context.Background()
	var err error
	big := &pb.CheckRequest{}
	for range 600 {
		big.Requests = append(big.Requests, &pb.CheckItem{Key: strings.Repeat("k", 1000)})
	}
	_, err = rl.Check(ctx, big)
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "--memory-limit") {
		t.Errorf("a 600 KB check within 1 MiB of requests: %v, want RESOURCE_EXHAUSTED naming --memory-limit", err)
	}
	if n := testutil.ToFloat64(g.refused.WithLabelValues("grpc")); n != 1 {
		t.Errorf("ringlimit_overload_rejected_total{interface=grpc} = %v, want 1", n)
	}
	for i := range 10 {
		if _, err := rl.Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{{Key: "k"}}}); err != nil {
			t.Fatalf("small check %d: %v", i, err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); g.bytes.used.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still held 10s after the calls ended", g.bytes.used.Load())
		}
	}
}

// TestLongCallsHeldSmall: a stream (Config.Streams or Config.Pools) is
// accounted at DefaultCallBytes while it is open, not at CallBytes, the
// arrival charge of a unary call's largest message, which would let a
// small memory limit hold few streams.
func TestLongCallsHeldSmall(t *testing.T) {
	const stream, pooled = "/ringlimit.v1.RateLimiter/CheckStream", "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
	g := New(Config{Max: 100, Streams: []string{stream}, MaxStreams: 100, Pools: map[string]int{pooled: 100},
		MaxBytes: 1 << 20, CallBytes: ArrivalBytes(2 << 20)})
	for i, m := range []string{stream, pooled, stream, pooled} {
		if _, err := g.Tap(context.Background(), &tap.Info{FullMethodName: m}); err != nil {
			t.Fatalf("stream %d within 1 MiB: %v", i, err)
		}
	}
	if got := g.bytes.used.Load(); got != 4*DefaultCallBytes {
		t.Errorf("4 streams hold %d bytes, want %d", got, 4*DefaultCallBytes)
	}
	if _, err := g.Tap(context.Background(), &tap.Info{FullMethodName: "/ringlimit.v1.RateLimiter/Check"}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a unary call at 2 MiB within 1 MiB: %v, want RESOURCE_EXHAUSTED", err)
	}
}
