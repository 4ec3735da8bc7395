package api

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/mux"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/service"
)

// openStream opens a CheckStream to s, served with ServerOptions.
func openStream(t *testing.T, s *Server) pb.RateLimiter_CheckStreamClient {
	t.Helper()
	conn := serveGRPC(t, s, ServerOptions()...)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := pb.NewRateLimiterClient(conn).CheckStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return stream
}

// exchange sends req on stream and returns the answer.
func exchange(t *testing.T, stream pb.RateLimiter_CheckStreamClient, req *pb.CheckStreamRequest) *pb.CheckStreamResponse {
	t.Helper()
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetId() != req.GetId() {
		t.Fatalf("answer of id %d to request %d", resp.GetId(), req.GetId())
	}
	return resp
}

// mixedItems are checks valid and not, of each kind of error.
func mixedItems() []*pb.CheckItem {
	return []*pb.CheckItem{
		{Name: "api", Key: "k", Limit: 1, DurationMs: 1000},
		{Name: "api", Key: "k", Limit: 1, DurationMs: 1000}, // refused: the first took the one hit
		{Name: "api", Key: "", Limit: 1, DurationMs: 1000},
		{Name: "api", Key: "k2", Limit: 0, DurationMs: 1000},
		{Name: "log", Key: "k", Limit: 1_000_000, DurationMs: 1000, Algorithm: pb.Algorithm_SLIDING_LOG},
		{Name: "api", Key: "k3", Limit: 5, DurationMs: 1000, Hits: proto.Int64(0)},
	}
}

// TestCheckStreamAnswersAsCheck: a request on a CheckStream gets the
// answer a Check of the same items gets, item by item, errors included;
// a request of too many items is refused as Check refuses it, and the
// stream goes on.
func TestCheckStreamAnswersAsCheck(t *testing.T) {
	t0 := time.Unix(1_795_315_155, 0)
	newServer := func() *Server {
		return New(Config{Checker: service.New(service.Config{Now: func() time.Time { return t0 }})})
	}
	want, err := pb.NewRateLimiterClient(serveGRPC(t, newServer(), ServerOptions()...)).Check(context.Background(), &pb.CheckRequest{Requests: mixedItems(), All: true})
	if err != nil {
		t.Fatal(err)
	}
	stream := openStream(t, newServer())
	got := exchange(t, stream, &pb.CheckStreamRequest{Id: 1, Requests: mixedItems(), All: true})
	if got.GetStatus() != nil || !proto.Equal(&pb.CheckResponse{Responses: got.GetResponses()}, want) {
		t.Errorf("on the stream: %v\nby Check: %v", got, want)
	}

	items := make([]*pb.CheckItem, checks.MaxItems+1)
	for i := range items {
		items[i] = &pb.CheckItem{}
	}
	refused := exchange(t, stream, &pb.CheckStreamRequest{Id: 2, Requests: items})
	if err := mux.Err(refused.GetStatus()); status.Code(err) != codes.InvalidArgument || len(refused.GetResponses()) > 0 {
		t.Errorf("too many items: %v, %v; want INVALID_ARGUMENT and no results", err, refused.GetResponses())
	}
	if after := exchange(t, stream, &pb.CheckStreamRequest{Id: 3, Requests: mixedItems()[:1]}); len(after.GetResponses()) != 1 {
		t.Errorf("the request after a refused one: %v", after)
	}
}

// TestCheckStreamBounds: the client port's bounds hold on a stream as on a
// Check: a request of a million empty items builds a thousand and one and
// is refused, and the stream goes on; a message over the receive limit
// ends the stream.
func TestCheckStreamBounds(t *testing.T) {
	conn := serveGRPC(t, New(Config{Checker: service.New(service.Config{})}), ServerOptions()...)
	desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
	open := func() grpc.ClientStream {
		s, err := conn.NewStream(context.Background(), desc, CheckStreamMethod, grpc.ForceCodecV2(rawCodec{}), grpc.MaxCallSendMsgSize(8<<20))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := open()
	msg := emptyItems(1_000_000) // 2 MB, under MaxRecvMsgBytes
	var answer []byte
	n := allocated(func() {
		if err := s.SendMsg(&msg); err != nil {
			t.Fatal(err)
		}
		if err := s.RecvMsg(&answer); err != nil {
			t.Fatal(err)
		}
	})
	resp := &pb.CheckStreamResponse{}
	if err := proto.Unmarshal(answer, resp); err != nil {
		t.Fatal(err)
	}
	if err := mux.Err(resp.GetStatus()); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "requests: more than 1000 items") {
		t.Errorf("a million empty items: %v, want INVALID_ARGUMENT naming requests", err)
	}
	if n > 16<<20 {
		t.Errorf("refusing a million empty items allocated %d bytes, want at most 16 MiB", n)
	}
	one := emptyItems(1)
	if err := s.SendMsg(&one); err != nil {
		t.Fatal(err)
	}
	if err := s.RecvMsg(&answer); err != nil {
		t.Fatalf("the request after a refused one: %v", err)
	}

	s = open()
	big := emptyItems(2_000_000)
	s.SendMsg(&big)
	if err := s.RecvMsg(&answer); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a message of 4 MB: %v, want RESOURCE_EXHAUSTED", err)
	}
}

// TestCheckStreamAdmits: each request takes a slot of AdmitMessage, and
// one refused is answered with the refusal, RetryInfo included.
func TestCheckStreamAdmits(t *testing.T) {
	st, err := status.New(codes.ResourceExhausted, "overloaded").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	admitted, done := 0, 0
	full := false
	stream := openStream(t, New(Config{Checker: service.New(service.Config{}), AdmitMessage: func(int64) (func(), error) {
		if full {
			return nil, st.Err()
		}
		admitted++
		return func() { done++ }, nil
	}}))
	if resp := exchange(t, stream, &pb.CheckStreamRequest{Id: 1, Requests: mixedItems()}); len(resp.GetResponses()) != len(mixedItems()) || admitted != 1 || done != 1 {
		t.Errorf("admitted: %v; slots taken %d, given back %d, want 1 and 1", resp, admitted, done)
	}
	full = true
	resp := exchange(t, stream, &pb.CheckStreamRequest{Id: 2, Requests: mixedItems()})
	got := status.Convert(mux.Err(resp.GetStatus()))
	if got.Code() != codes.ResourceExhausted || len(got.Details()) != 1 || len(resp.GetResponses()) > 0 {
		t.Errorf("refused: %v %v, results %v; want RESOURCE_EXHAUSTED with its RetryInfo, no results", got, got.Details(), resp.GetResponses())
	}
}

// deadlines records the deadline of each check's context.
type deadlines struct{ got chan time.Duration }

func (d deadlines) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	left := time.Duration(-1)
	if at, ok := ctx.Deadline(); ok {
		left = time.Until(at)
	}
	d.got <- left
	return &pb.CheckResponse{Responses: make([]*pb.CheckResult, len(req.GetRequests()))}, nil
}

// TestCheckStreamTimeout: a request's timeout_ms becomes its context's
// deadline, as a Check's deadline does; without one there is none.
func TestCheckStreamTimeout(t *testing.T) {
	d := deadlines{got: make(chan time.Duration, 2)}
	stream := openStream(t, New(Config{Checker: d}))
	exchange(t, stream, &pb.CheckStreamRequest{Id: 1, TimeoutMs: 60_000})
	if left := <-d.got; left <= 0 || left > time.Minute {
		t.Errorf("timeout_ms 60000: %v left, want under a minute", left)
	}
	exchange(t, stream, &pb.CheckStreamRequest{Id: 2})
	if left := <-d.got; left != -1 {
		t.Errorf("no timeout_ms: a deadline %v away, want none", left)
	}
}

// TestCheckStreamTellsStaleRing: a request routed by another ring than the
// node's gets the node's fingerprint; one routed by the node's, or by
// none, gets none.
func TestCheckStreamTellsStaleRing(t *testing.T) {
	r := ring.New(ring.Member{Name: "a", GRPCAddr: "a:1"}, ring.Member{Name: "b", GRPCAddr: "b:1"})
	s := New(Config{Checker: service.New(service.Config{}), Ring: func() *ring.Ring { return r }})
	stream := openStream(t, s)
	ours := s.ringID().sum
	for _, tc := range []struct {
		theirs, want uint64
	}{{ours + 1, ours}, {ours, 0}, {0, 0}} {
		if got := exchange(t, stream, &pb.CheckStreamRequest{Id: 1, Ring: tc.theirs}).GetRing(); got != tc.want {
			t.Errorf("a request routed by ring %x: answered ring %x, want %x", tc.theirs, got, tc.want)
		}
	}
}

// TestDrainEndsStreams: a drained server asks its streams' clients to
// end them, with an answer of id 0 and a status, and answers what it
// receives until they do.
func TestDrainEndsStreams(t *testing.T) {
	s := New(Config{Checker: service.New(service.Config{})})
	stream := openStream(t, s)
	exchange(t, stream, &pb.CheckStreamRequest{Id: 1, Requests: mixedItems()})
	s.Drain()
	notice, err := stream.Recv()
	if err != nil || notice.GetId() != 0 || status.Code(mux.Err(notice.GetStatus())) != codes.Unavailable {
		t.Fatalf("after Drain: %v, %v; want a notice of id 0, UNAVAILABLE", notice, err)
	}
	exchange(t, stream, &pb.CheckStreamRequest{Id: 2, Requests: mixedItems()})
	stream.CloseSend()
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("the stream after the client ended it: %v, want EOF", err)
	}
}
