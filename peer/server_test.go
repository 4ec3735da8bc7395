package peer

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// fakeHandler echoes forwarded requests (see echo) and counts calls. If
// block is non-nil, Forwarded waits for it or for the RPC's end.
type fakeHandler struct {
	block    chan struct{}
	entered  chan struct{} // if non-nil, gets a value each time Forwarded starts
	forwards atomic.Int64
	answer   func([]*pb.CheckRequest) []*pb.CheckResponse // nil means echo
	refusals []*pb.Refusal                                // if non-nil, HandOff's answer

	mu         sync.Mutex
	hits       []*pb.GlobalReport
	reportedBy string
	states     []*pb.GlobalState
	handedBy   string
}

func (h *fakeHandler) Forwarded(ctx context.Context, reqs []*pb.CheckRequest) []*pb.CheckResponse {
	h.forwards.Add(1)
	if h.entered != nil {
		h.entered <- struct{}{}
	}
	if h.block != nil {
		select {
		case <-h.block:
		case <-ctx.Done():
		}
	}
	if h.answer != nil {
		return h.answer(reqs)
	}
	return echo(reqs)
}

func (h *fakeHandler) AddGlobalHits(_ context.Context, from string, reports []*pb.GlobalReport) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hits = append(h.hits, reports...)
	h.reportedBy = from
}

func (h *fakeHandler) UpdateGlobals(_ context.Context, states []*pb.GlobalState) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.states = append(h.states, states...)
}

// HandOff refuses, as INVALID, every counter with an empty record, unless
// refusals says what to answer.
func (h *fakeHandler) HandOff(_ context.Context, from string, counters []*pb.CounterState) []*pb.Refusal {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.handedBy = from
	if h.refusals != nil {
		return h.refusals
	}
	var refused []*pb.Refusal
	for i, c := range counters {
		if len(c.GetCounter()) == 0 {
			refused = append(refused, &pb.Refusal{Index: int32(i), Reason: pb.Refusal_INVALID, Detail: "empty"})
		}
	}
	return refused
}

// serve starts a Peer server for h on a loopback port and returns its
// address. The server stops at the test's cleanup.
func serve(t testing.TB, h Handler) string {
	t.Helper()
	return serveService(t, NewServer(h))
}

// serveService is serve for any implementation of the Peer service, such
// as one that breaks the protocol, with the server options opts.
func serveService(t testing.TB, srv pb.PeerServer, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(opts...)
	pb.RegisterPeerServer(g, srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(lis)
	}()
	t.Cleanup(func() {
		g.Stop()
		<-done
	})
	return lis.Addr().String()
}

func TestServerForwardBounds(t *testing.T) {
	many := make([]*pb.CheckRequest, MaxForwardItems+1)
	for i := range many {
		many[i] = &pb.CheckRequest{}
	}
	big := []*pb.CheckRequest{check("a", MaxForwardItems/2), check("b", MaxForwardItems/2+1)}
	tests := []struct {
		name   string
		reqs   []*pb.CheckRequest
		answer func([]*pb.CheckRequest) []*pb.CheckResponse
		want   codes.Code
	}{
		{name: "ok", reqs: []*pb.CheckRequest{check("a", 2), check("b", 1)}, want: codes.OK},
		{name: "empty", reqs: nil, want: codes.OK},
		{name: "at the item limit", reqs: []*pb.CheckRequest{check("a", MaxForwardItems)}, want: codes.OK},
		{name: "too many requests", reqs: many, want: codes.InvalidArgument},
		{name: "too many items", reqs: big, want: codes.InvalidArgument},
		{
			name:   "handler answers too few",
			reqs:   []*pb.CheckRequest{check("a", 1), check("b", 1)},
			answer: func(reqs []*pb.CheckRequest) []*pb.CheckResponse { return echo(reqs[:1]) },
			want:   codes.Internal,
		},
		{
			name:   "handler answers nil",
			reqs:   []*pb.CheckRequest{check("a", 1)},
			answer: func([]*pb.CheckRequest) []*pb.CheckResponse { return []*pb.CheckResponse{nil} },
			want:   codes.Internal,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &fakeHandler{answer: tt.answer}
			resp, err := NewServer(h).Forward(t.Context(), &pb.ForwardRequest{Requests: tt.reqs})
			if got := status.Code(err); got != tt.want {
				t.Fatalf("code = %v (%v), want %v", got, err, tt.want)
			}
			if err != nil {
				if tt.want == codes.InvalidArgument && h.forwards.Load() != 0 {
					t.Error("handler called for a refused batch")
				}
				return
			}
			if len(resp.GetResponses()) != len(tt.reqs) {
				t.Fatalf("%d responses for %d requests", len(resp.GetResponses()), len(tt.reqs))
			}
		})
	}
}

// TestServerHandOffRefusals: the response counts what the handler did not
// refuse, and a handler that refuses counters it was not given is a bug
// the server reports rather than passes on.
func TestServerHandOffRefusals(t *testing.T) {
	two := []*pb.CounterState{{Counter: []byte{1}}, {Counter: []byte{1}}}
	for _, tt := range []struct {
		name     string
		refusals []*pb.Refusal
		want     codes.Code
		accepted int64
	}{
		{"none refused", []*pb.Refusal{}, codes.OK, 2},
		{"one refused", []*pb.Refusal{{Index: 1, Reason: pb.Refusal_UNKNOWN_VERSION}}, codes.OK, 1},
		{"index out of range", []*pb.Refusal{{Index: 2}}, codes.Internal, 0},
		{"negative index", []*pb.Refusal{{Index: -1}}, codes.Internal, 0},
		{"refused twice", []*pb.Refusal{{Index: 0}, {Index: 0}}, codes.Internal, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := &fakeHandler{refusals: tt.refusals}
			resp, err := NewServer(h).HandOff(t.Context(), &pb.HandOffRequest{From: "a", Counters: two})
			if got := status.Code(err); got != tt.want {
				t.Fatalf("code = %v (%v), want %v", got, err, tt.want)
			}
			if resp.GetAccepted() != tt.accepted || len(resp.GetRefused()) != int(2-tt.accepted) && err == nil {
				t.Errorf("accepted %d, refused %v; want %d accepted", resp.GetAccepted(), resp.GetRefused(), tt.accepted)
			}
		})
	}
}

// handOffAnswer is a Peer service whose HandOff always gives one answer,
// however wrong.
type handOffAnswer struct {
	pb.UnimplementedPeerServer
	resp *pb.HandOffResponse
}

func (h handOffAnswer) HandOff(context.Context, *pb.HandOffRequest) (*pb.HandOffResponse, error) {
	return h.resp, nil
}

// TestPoolHandOffChecksTheAnswer: an answer that does not say which
// counters were taken is an error, so the sender keeps them all rather
// than guess.
func TestPoolHandOffChecksTheAnswer(t *testing.T) {
	two := []*pb.CounterState{{Counter: []byte{1}}, {Counter: []byte{2}}}
	for _, tt := range []struct {
		name string
		resp *pb.HandOffResponse
		ok   bool
	}{
		{"all taken", &pb.HandOffResponse{Accepted: 2}, true},
		{"one refused", &pb.HandOffResponse{Accepted: 1, Refused: []*pb.Refusal{{Index: 0}}}, true},
		{"accepted disagrees", &pb.HandOffResponse{Accepted: 2, Refused: []*pb.Refusal{{Index: 0}}}, false},
		{"refusal out of range", &pb.HandOffResponse{Accepted: 1, Refused: []*pb.Refusal{{Index: 5}}}, false},
		{"refused twice", &pb.HandOffResponse{Accepted: 0, Refused: []*pb.Refusal{{Index: 1}, {Index: 1}}}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr := serveService(t, handOffAnswer{resp: tt.resp})
			p := NewPool(Config{})
			defer p.Close()
			refused, err := p.HandOff(t.Context(), addr, "me", two)
			if (err == nil) != tt.ok {
				t.Fatalf("HandOff = %v, %v; want ok %v", refused, err, tt.ok)
			}
			if err == nil && len(refused) != len(tt.resp.Refused) {
				t.Errorf("HandOff returned %d refusals, the peer sent %d", len(refused), len(tt.resp.Refused))
			}
		})
	}
}
