package mux

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// node serves CheckStream with a mux.Server whose handler answers each
// request with one result per item, of the item's limit, so that a caller
// can tell its answer apart, and the goroutine that decided it in its
// metadata. An item keyed "wait" makes the handler detach and wait for
// release (or the request's end); one keyed "hold" makes it wait so
// without calling Detach; "derived", wait so on a context derived from
// the request's; "rpc", make a Check RPC (rpc) that the node holds until
// release.
type node struct {
	pb.UnimplementedRateLimiterServer
	sr      *Server[pb.CheckStreamRequest, pb.CheckStreamResponse]
	entered chan string // the key of each waiting request, as it starts waiting
	release chan struct{}
	served  chan error // what each Serve returned
	rpc     pb.RateLimiterClient
}

func newNode() *node {
	n := &node{entered: make(chan string, 16), release: make(chan struct{}), served: make(chan error, 16)}
	n.sr = &Server[pb.CheckStreamRequest, pb.CheckStreamResponse]{
		Timeout: func(r *pb.CheckStreamRequest) time.Duration {
			return time.Duration(r.GetTimeoutMs()) * time.Millisecond
		},
		Handle: n.handle,
		Notice: func(reason error) *pb.CheckStreamResponse {
			return &pb.CheckStreamResponse{Status: Status(reason)}
		},
	}
	return n
}

func (n *node) handle(ctx context.Context, req *pb.CheckStreamRequest) *pb.CheckStreamResponse {
	resp := &pb.CheckStreamResponse{Id: req.GetId()}
	for _, it := range req.GetRequests() {
		wait := ctx
		switch it.GetKey() {
		case "wait":
			Detach(ctx)
		case "derived":
			var cancel context.CancelFunc
			wait, cancel = context.WithTimeout(ctx, time.Hour)
			defer cancel()
		case "rpc":
			n.entered <- it.GetKey()
			if _, err := n.rpc.Check(ctx, &pb.CheckRequest{}); err != nil {
				resp.Status = Status(err)
				return resp
			}
		}
		switch it.GetKey() {
		case "wait", "hold", "derived":
			n.entered <- it.GetKey()
			select {
			case <-n.release:
			case <-wait.Done():
				resp.Status = Status(status.FromContextError(wait.Err()).Err())
				return resp
			}
		}
		resp.Responses = append(resp.Responses, &pb.CheckResult{Limit: it.GetLimit(), Metadata: map[string]string{"goroutine": goroutine()}})
	}
	return resp
}

// Check answers once release is closed, or fails when ctx ends.
func (n *node) Check(ctx context.Context, _ *pb.CheckRequest) (*pb.CheckResponse, error) {
	select {
	case <-n.release:
		return &pb.CheckResponse{}, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// goroutine returns the id of the goroutine that calls it, as the
// runtime prints it in a trace ("goroutine 7 [running]:").
func goroutine() string {
	b := make([]byte, 64)
	return string(bytes.Fields(b[:runtime.Stack(b, false)])[1])
}

func (n *node) CheckStream(s pb.RateLimiter_CheckStreamServer) error {
	err := n.sr.Serve(s)
	n.served <- err
	return err
}

// serve runs g on loopback, and returns its address; the test stops it.
func serve(t testing.TB, g *grpc.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// dial returns a Client of CheckStream at addr, with the connection up.
func dial(t testing.TB, addr string) (*Client[pb.CheckStreamRequest, pb.CheckStreamResponse], *grpc.ClientConn) {
	return dialWith(t, addr, nil, false)
}

// checkStream is a CheckStream as a client opens it.
type checkStream = grpc.BidiStreamingClient[pb.CheckStreamRequest, pb.CheckStreamResponse]

// dialWith is dial, with each stream the Client opens wrapped by wrap
// (nil: none), and with sized, a Config.Size: proto.Size, as a bound.
func dialWith(t testing.TB, addr string, wrap func(checkStream) checkStream, sized bool) (*Client[pb.CheckStreamRequest, pb.CheckStreamResponse], *grpc.ClientConn) {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	rl := pb.NewRateLimiterClient(cc)
	open := rl.CheckStream
	if wrap != nil {
		open = func(ctx context.Context, opts ...grpc.CallOption) (checkStream, error) {
			s, err := rl.CheckStream(ctx, opts...)
			if err != nil {
				return nil, err
			}
			return wrap(s), nil
		}
	}
	c := NewClient(Config[pb.CheckStreamRequest, pb.CheckStreamResponse]{
		Open:  open,
		Ready: func() bool { return cc.GetState() == connectivity.Ready },
		Stamp: func(r *pb.CheckStreamRequest, id uint64, timeoutMs int64) {
			r.Id = id
			if timeoutMs > 0 { // else keep the test's own
				r.TimeoutMs = timeoutMs
			}
		},
		ID: (*pb.CheckStreamResponse).GetId,
	})
	if sized {
		c.conf.Size = func(r *pb.CheckStreamRequest) int { return proto.Size(r) }
	}
	t.Cleanup(c.Close)
	connect(t, cc)
	return c, cc
}

// connect waits until cc is connected, as a client's first RPC makes it.
func connect(t testing.TB, cc *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc.Connect()
	for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
		if !cc.WaitForStateChange(ctx, s) {
			t.Fatalf("not connected within 10s: %v", s)
		}
	}
}

func request(key string, limit int64) *pb.CheckStreamRequest {
	return &pb.CheckStreamRequest{Requests: []*pb.CheckItem{{Name: "n", Key: key, Limit: limit}}}
}

// call sends request(key, limit) and checks that its answer is its own.
func call(ctx context.Context, c *Client[pb.CheckStreamRequest, pb.CheckStreamResponse], key string, limit int64) error {
	resp, err := c.Call(ctx, request(key, limit))
	if err != nil {
		return err
	}
	if err := Err(resp.GetStatus()); err != nil {
		return err
	}
	if len(resp.GetResponses()) != 1 || resp.GetResponses()[0].GetLimit() != limit {
		return fmt.Errorf("request of limit %d answered %v", limit, resp)
	}
	return nil
}

func newServer(n *node, opts ...grpc.ServerOption) *grpc.Server {
	g := grpc.NewServer(opts...)
	pb.RegisterRateLimiterServer(g, n)
	return g
}

// TestEachCallGetsItsAnswer: concurrent calls on one stream each get the
// answer to their own request, and the stream stays open between them.
func TestEachCallGetsItsAnswer(t *testing.T) {
	n := newNode()
	c, _ := dial(t, serve(t, newServer(n)))
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			if err := call(context.Background(), c, fmt.Sprint("k", i), int64(i+1)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := call(context.Background(), c, "again", 7); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-n.served:
		t.Fatalf("the stream ended between calls: %v", err)
	default:
	}
}

// TestDetachedRequestHoldsNoOther: a request that detaches before it waits
// lets the stream's next requests through, and is answered when it is
// done; its deadline travels with it.
func TestDetachedRequestHoldsNoOther(t *testing.T) {
	n := newNode()
	c, _ := dial(t, serve(t, newServer(n)))
	waiting := make(chan error, 1)
	go func() { waiting <- call(context.Background(), c, "wait", 1) }()
	<-n.entered
	if err := call(context.Background(), c, "quick", 2); err != nil {
		t.Fatalf("a request behind one that waits: %v", err)
	}
	close(n.release)
	if err := <-waiting; err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	n2 := newNode()
	c2, _ := dial(t, serve(t, newServer(n2)))
	resp, err := c2.Call(context.Background(), &pb.CheckStreamRequest{Requests: []*pb.CheckItem{{Key: "wait"}}, TimeoutMs: 50})
	if err != nil || status.Code(Err(resp.GetStatus())) != codes.DeadlineExceeded {
		t.Errorf("a request of timeout_ms 50 that waits for ever: %v, %v; want its deadline to end it", resp, err)
	}
	if err := call(ctx, c2, "hold", 3); !errors.Is(err, context.DeadlineExceeded) && status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("a caller whose context ends: %v, want its deadline's error (the caller's, or the node's)", err)
	}
}

// TestWaitsDetachByThemselves is the rule of Serve: a request that waits
// holds up the stream's next requests only until it starts to wait,
// without calling Detach, whether it waits on its context, on a context
// derived from it or in an RPC; and requests that do not wait are
// decided, one after another, by the goroutine that receives them.
func TestWaitsDetachByThemselves(t *testing.T) {
	for _, key := range []string{"hold", "derived", "rpc"} {
		t.Run(key, func(t *testing.T) {
			n := newNode()
			addr := serve(t, newServer(n))
			c, cc := dial(t, addr)
			n.rpc = pb.NewRateLimiterClient(cc)
			receiver := func() string {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a bound, not a timing
				defer cancel()
				resp, err := c.Call(ctx, request("quick", 1))
				if err != nil || Err(resp.GetStatus()) != nil || len(resp.GetResponses()) != 1 {
					t.Fatalf("a quick request (behind one that waits?): %v, %v", resp, err)
				}
				return resp.GetResponses()[0].GetMetadata()["goroutine"]
			}
			first := receiver()
			for range 5 {
				if got := receiver(); got != first {
					t.Fatalf("requests that do not wait were decided by goroutines %s and %s, want one: a hand-over each", first, got)
				}
			}
			waiting := make(chan error, 1)
			go func() { waiting <- call(context.Background(), c, key, 2) }()
			<-n.entered
			if next := receiver(); next == first {
				t.Errorf("a request behind one that waits was decided by %s, the waiting one's", next)
			}
			close(n.release)
			if err := <-waiting; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// sentBy records the goroutine of each Send on a stream.
type sentBy struct {
	checkStream
	mu   *sync.Mutex
	gids *[]string
}

func (s sentBy) Send(m *pb.CheckStreamRequest) error {
	s.mu.Lock()
	*s.gids = append(*s.gids, goroutine())
	s.mu.Unlock()
	return s.checkStream.Send(m)
}

// TestCallersSendThemselves: a call to a stream with no request
// unanswered is sent from its caller's goroutine, as every call of a lone
// caller is, with no hand-over to the sending goroutine; so is one made
// while others are unanswered, if Config.Size bounds them under the write
// quota. Without Size it is handed over, so that its caller waits for a
// send (that might block) with its context.
func TestCallersSendThemselves(t *testing.T) {
	for _, sized := range []bool{false, true} {
		t.Run(fmt.Sprint("sized=", sized), func(t *testing.T) {
			var mu sync.Mutex
			var gids []string
			sender := func() string {
				mu.Lock()
				defer mu.Unlock()
				return gids[len(gids)-1]
			}
			n := newNode()
			c, _ := dialWith(t, serve(t, newServer(n)), func(s checkStream) checkStream { return sentBy{s, &mu, &gids} }, sized)
			me := goroutine()
			for i := range 3 {
				if err := call(context.Background(), c, "k", int64(i+1)); err != nil {
					t.Fatal(err)
				}
				if got := sender(); got != me {
					t.Fatalf("call %d of a lone caller was sent by goroutine %s, want its own, %s", i, got, me)
				}
			}
			waiting := make(chan error, 1)
			go func() { waiting <- call(context.Background(), c, "wait", 1) }()
			<-n.entered
			if err := call(context.Background(), c, "behind", 2); err != nil {
				t.Fatal(err)
			}
			if got := sender(); (got == me) != sized {
				t.Errorf("a call made while another was unanswered was sent by goroutine %s; its caller is %s", got, me)
			}
			close(n.release)
			if err := <-waiting; err != nil {
				t.Fatal(err)
			}
			if err := call(context.Background(), c, "k", 4); err != nil || sender() != me {
				t.Errorf("a call once every request was answered: %v, sent by %s; want sent by its caller, %s", err, sender(), me)
			}
		})
	}
}

// TestCallsBehindABlockedSendKeepTheirDeadlines: when the node reads no
// more of a stream and gRPC's flow control blocks its sends, calls still
// return as their contexts end, none blocked in a send of its own, with
// Config.Size or without.
func TestCallsBehindABlockedSendKeepTheirDeadlines(t *testing.T) {
	for _, sized := range []bool{false, true} {
		t.Run(fmt.Sprint("sized=", sized), func(t *testing.T) { testBlockedSend(t, sized) })
	}
}

func testBlockedSend(t *testing.T, sized bool) {
	n := newNode()
	window := grpc.StaticStreamWindowSize(64 << 10) // the node reads no more than this of a stream it does not read
	c, _ := dialWith(t, serve(t, newServer(n, window)), nil, sized)
	held := make(chan error, Workers)
	for i := range Workers {
		go func() { held <- call(context.Background(), c, "wait", int64(i)) }()
	}
	for range Workers {
		<-n.entered // the node reads the stream no further
	}
	big := strings.Repeat("k", 60<<10)
	const calls = 5 // the node's window, gRPC's write quota, and sends that block
	errs := make(chan error, calls)
	go func() {
		for i := range calls { // one after another: each is the only call made
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			errs <- call(ctx, c, big, int64(i))
			cancel()
		}
	}()
	for range calls {
		select {
		case err := <-errs:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("a call the node did not read: %v, want its deadline's error", err)
			}
		case <-time.After(10 * time.Second): // a bound, not a timing
			t.Fatal("a call behind a blocked send did not return when its context ended")
		}
	}
	// The send is blocked: maxQueued calls fill the queue, and callers
	// that give up waiting for room in it leave nothing behind, however
	// many they are.
	var wg sync.WaitGroup
	for i := range maxQueued + 50 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			if err := call(ctx, c, "k", int64(i)); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("a call behind a full queue: %v, want its deadline's error", err)
			}
		})
	}
	wg.Wait()
	c.mu.Lock()
	st := c.cur
	c.mu.Unlock()
	st.mu.Lock()
	pending := len(st.pending)
	st.mu.Unlock()
	if most := Workers + calls + maxQueued; pending > most {
		t.Errorf("%d requests pending, want at most %d: those sent or queued", pending, most)
	}
	close(n.release)
	for range Workers {
		if err := <-held; err != nil {
			t.Error(err)
		}
	}
}

// TestWorkersBound: at most Workers requests of a stream are decided at
// once; the stream is not read further until one is answered.
func TestWorkersBound(t *testing.T) {
	n := newNode()
	c, _ := dial(t, serve(t, newServer(n)))
	errs := make(chan error, Workers+1)
	for i := range Workers + 1 {
		go func() { errs <- call(context.Background(), c, "wait", int64(i)) }()
	}
	for range Workers {
		<-n.entered
	}
	select {
	case key := <-n.entered:
		t.Fatalf("request %q decided beyond %d at once", key, Workers)
	case <-time.After(100 * time.Millisecond): // a bound that holds, not a timing
	}
	close(n.release)
	for range Workers + 1 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestRefusedStreamIsNotRetriedAtOnce: a node that refuses the stream (an
// older one, or one that does not know the caller) decides nothing on it;
// the call fails with ErrRefused, and so do the calls of the next
// RetryAfter, without a new stream each.
func TestRefusedStreamIsNotRetriedAtOnce(t *testing.T) {
	var mu sync.Mutex
	opened := 0
	n := newNode()
	g := newServer(n, grpc.StreamInterceptor(func(any, grpc.ServerStream, *grpc.StreamServerInfo, grpc.StreamHandler) error {
		mu.Lock()
		opened++
		mu.Unlock()
		return status.Error(codes.PermissionDenied, "who are you")
	}))
	c, _ := dial(t, serve(t, g))
	for range 3 {
		if err := call(context.Background(), c, "k", 1); !errors.Is(err, ErrRefused) {
			t.Fatalf("call on a refused stream: %v, want ErrRefused", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if opened != 1 {
		t.Errorf("%d streams opened for 3 calls, want 1", opened)
	}
}

// TestNodeGoesAwayMidStream: calls in flight when the node stops fail
// with UNAVAILABLE, not ErrRefused (the node may have decided them), and
// the client's goroutines end (TestMain checks).
func TestNodeGoesAwayMidStream(t *testing.T) {
	n := newNode()
	g := newServer(n)
	c, _ := dial(t, serve(t, g))
	errs := make(chan error, 1)
	go func() { errs <- call(context.Background(), c, "hold", 1) }()
	<-n.entered
	g.Stop()
	if err := <-errs; status.Code(err) != codes.Unavailable || errors.Is(err, ErrRefused) {
		t.Errorf("call in flight as the node stopped: %v, want UNAVAILABLE", err)
	}
	if err := call(context.Background(), c, "k", 1); err == nil {
		t.Error("a call to a stopped node succeeded")
	}
}

// TestClientGoesAwayMidStream: when the client goes, the node's Serve
// ends its requests' contexts and returns, with nothing left running.
func TestClientGoesAwayMidStream(t *testing.T) {
	n := newNode()
	c, cc := dial(t, serve(t, newServer(n)))
	errs := make(chan error, 2)
	go func() { errs <- call(context.Background(), c, "wait", 1) }()
	<-n.entered // detached: the next is received
	go func() { errs <- call(context.Background(), c, "hold", 2) }()
	<-n.entered
	c.Close()
	for range 2 {
		if err := <-errs; !errors.Is(err, ErrClosed) {
			t.Errorf("call in flight as the client closed: %v, want ErrClosed", err)
		}
	}
	if err := <-n.served; err == nil {
		t.Error("Serve returned nil for a client that went away")
	}
	if err := call(context.Background(), c, "k", 1); !errors.Is(err, ErrClosed) {
		t.Errorf("a call after Close: %v, want ErrClosed", err)
	}
	cc.Close()
}

// TestDrain: a node that drains answers what it has received, and its
// clients end their streams and send the next requests another way, so
// that GracefulStop returns.
func TestDrain(t *testing.T) {
	n := newNode()
	g := newServer(n)
	c, _ := dial(t, serve(t, g))
	errs := make(chan error, 1)
	go func() { errs <- call(context.Background(), c, "wait", 1) }()
	<-n.entered
	n.sr.Drain()
	// The notice arrives; until then a call may still go on the stream.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		err := call(context.Background(), c, "k", 2)
		if errors.Is(err, ErrRefused) {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("a call while the node drains: %v, want an answer and then ErrRefused", err)
		}
	}
	close(n.release)
	if err := <-errs; err != nil {
		t.Errorf("the request in flight as the node drained: %v, want its answer", err)
	}
	if err := <-n.served; err != nil {
		t.Errorf("Serve returned %v after its client ended the stream, want nil", err)
	}
	stopped := make(chan struct{})
	go func() {
		g.GracefulStop()
		close(stopped)
	}()
	<-stopped // or the test hangs
}

// raw sends and receives messages as bytes, as they are on the wire, to
// send what no client of this module would. It is named "proto", which
// the server decodes with.
type raw struct{}

func (raw) Name() string { return "proto" }
func (raw) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}
func (raw) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// TestGarbageAndOversizedMessages: a message that does not decode, or is
// over the server's receive limit, ends its stream with an error, and the
// node serves other streams as before.
func TestGarbageAndOversizedMessages(t *testing.T) {
	n := newNode()
	addr := serve(t, newServer(n, grpc.MaxRecvMsgSize(1024)))
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.ForceCodecV2(raw{})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	desc := &grpc.StreamDesc{StreamName: "CheckStream", ServerStreams: true, ClientStreams: true}
	for _, tc := range []struct {
		name string
		msg  []byte
		code codes.Code
	}{
		{"garbage", []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}, codes.Internal},
		{"oversized", make([]byte, 2048), codes.ResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := cc.NewStream(ctx, desc, "/ringlimit.v1.RateLimiter/CheckStream")
			if err != nil {
				t.Fatal(err)
			}
			if err := s.SendMsg(tc.msg); err != nil {
				t.Fatal(err)
			}
			var got []byte
			if err := s.RecvMsg(&got); status.Code(err) != tc.code {
				t.Errorf("stream after a %s message: %v, %x; want %v", tc.name, err, got, tc.code)
			}
		})
	}
	c, _ := dial(t, addr)
	if err := call(context.Background(), c, "k", 1); err != nil {
		t.Errorf("a stream after the others failed: %v", err)
	}
}

// TestStatus: a refusal's status travels whole, details included; a status
// that does not decode, or says OK, is an error of its own.
func TestStatus(t *testing.T) {
	st, err := status.New(codes.ResourceExhausted, "overloaded").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	got := status.Convert(Err(Status(st.Err())))
	if got.Code() != codes.ResourceExhausted || got.Message() != "overloaded" || len(got.Details()) != 1 {
		t.Errorf("round trip: %v %v, want the status with its RetryInfo", got, got.Details())
	}
	if Status(nil) != nil || Err(nil) != nil {
		t.Error("no error should travel as no status")
	}
	if got := Err(Status(status.Error(codes.InvalidArgument, "bad \xff"))); status.Code(got) != codes.InvalidArgument {
		t.Errorf("a message that is not UTF-8: %v", got)
	}
	for _, b := range [][]byte{{0xff}, {0x12, 0x02, 'o', 'k'}} { // garbage; a status of code OK
		if got := Err(b); status.Code(got) != codes.Internal {
			t.Errorf("status %x: %v, want INTERNAL", b, got)
		}
	}
}
