package peer

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/mux"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/internal/testpki"
)

// forwardStream opens a ForwardStream on c, naming itself from (none if
// empty), sends a batch of two requests and returns the first answer or
// the stream's error.
func forwardStream(t *testing.T, c peerpb.PeerClient, from string) (*peerpb.ForwardStreamResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	if from != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, SenderHeader, from)
	}
	s, err := c.ForwardStream(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.Send(&peerpb.ForwardStreamRequest{Id: 1, Requests: []*pb.CheckRequest{check("x", 1), check("y", 2)}}); err != nil && err != io.EOF {
		return nil, err
	}
	return s.Recv() // after a refusal, Send may say only io.EOF: Recv says why

}

// TestForwardStreamGuard: a stream of forwards is taken only from a member
// under its own name: with mutual TLS, the name its certificate is valid
// for; without, a member's. A forged or missing sender is refused before
// any forward reaches the handler.
func TestForwardStreamGuard(t *testing.T) {
	ca := testpki.NewCA(t, "cluster")
	h := &fakeHandler{}
	addr, reg := guarded(t, h, ca, members{"a", "b"})
	asB := dialAs(t, addr, ca, "b")
	if resp, err := forwardStream(t, asB, "b"); err != nil || len(resp.GetResponses()) != 2 {
		t.Fatalf("b as b: %v, %v; want both requests answered", resp, err)
	}
	for _, tc := range []struct {
		name   string
		client peerpb.PeerClient
		from   string
		reason string
	}{
		{"b's certificate claiming a", asB, "a", refusedWrongName},
		{"b's certificate naming no one", asB, "", refusedWrongName},
		{"a cluster certificate of a non-member", dialAs(t, addr, ca, "x"), "x", refusedNotMember},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := refusals(t, reg, tc.reason)
			if _, err := forwardStream(t, tc.client, tc.from); status.Code(err) != codes.PermissionDenied {
				t.Errorf("%v, want PermissionDenied", err)
			}
			if got := refusals(t, reg, tc.reason); got != before+1 {
				t.Errorf("%s refusals = %v, want %v", tc.reason, got, before+1)
			}
		})
	}

	plain := &fakeHandler{}
	plainAddr, _ := guarded(t, plain, nil, members{"a", "b"})
	c := dialAs(t, plainAddr, nil, "")
	for _, from := range []string{"ghost", ""} {
		if _, err := forwardStream(t, c, from); status.Code(err) != codes.PermissionDenied {
			t.Errorf("without TLS, from %q: %v, want PermissionDenied", from, err)
		}
	}
	if h.forwards.Load() != 1 || plain.forwards.Load() != 0 {
		t.Errorf("forwards that reached the handlers: %d and %d, want only b's", h.forwards.Load(), plain.forwards.Load())
	}
}

// TestForwardStreamBounds: a batch on a stream is bounded as a Forward
// is; one refused is answered with the refusal, and the stream goes on.
func TestForwardStreamBounds(t *testing.T) {
	h := &fakeHandler{}
	addr := serveService(t, NewServer(h, nil))
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	s, err := peerpb.NewPeerClient(cc).ForwardStream(metadata.AppendToOutgoingContext(t.Context(), SenderHeader, "a"))
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		reqs []*pb.CheckRequest
		code codes.Code
	}{
		{[]*pb.CheckRequest{check("big", checks.MaxItems+1)}, codes.InvalidArgument},
		{requests(MaxForwardItems+1, 0), codes.InvalidArgument},
		{[]*pb.CheckRequest{check("ok", 2)}, codes.OK},
	} {
		if err := s.Send(&peerpb.ForwardStreamRequest{Id: uint64(i + 1), Requests: tc.reqs}); err != nil {
			t.Fatal(err)
		}
		resp, err := s.Recv()
		if err != nil {
			t.Fatalf("batch %d: the stream ended: %v", i, err)
		}
		if got := status.Code(mux.Err(resp.GetStatus())); got != tc.code || resp.GetId() != uint64(i+1) {
			t.Errorf("batch %d: id %d, %v; want id %d, %v", i, resp.GetId(), got, i+1, tc.code)
		}
	}
	if h.forwards.Load() != 1 {
		t.Errorf("%d batches reached the handler, want the one within bounds", h.forwards.Load())
	}
}

// TestPoolFallsBackToForward: a peer that refuses the pool's stream (it
// does not know this node yet, or is of an older version) still gets its
// batches, as Forward RPCs.
func TestPoolFallsBackToForward(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    members
	}{
		{"peer that does not know the sender", members{"someone else"}},
		{"peer that knows it", members{"me"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &fakeHandler{}
			addr, _ := guarded(t, h, nil, tc.m)
			p, _ := startPool(t, Config{Name: "me"})
			for i := range 5 {
				resp, err := p.Forward(t.Context(), addr, check("k", 1))
				if err != nil || keyOf(resp) != "k" {
					t.Fatalf("forward %d: %v, %v", i, resp, err)
				}
			}
			if h.forwards.Load() != 5 {
				t.Errorf("the peer decided %d batches, want 5", h.forwards.Load())
			}
		})
	}
}

// TestServerDrainsStreams: a peer server that drains answers the batch in
// flight on its stream, and the pool sends its later batches as Forward
// RPCs, without a new stream, until the peer stops.
func TestServerDrainsStreams(t *testing.T) {
	h := &fakeHandler{block: make(chan struct{}, 8), entered: make(chan struct{}, 8)}
	srv := NewServer(h, nil)
	var streams atomic.Int64
	addr := serveService(t, srv, grpc.ChainStreamInterceptor(func(s any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		streams.Add(1)
		return handler(s, ss)
	}))
	p, _ := startPool(t, Config{Name: "me"})
	forward := func(key string) <-chan error {
		errs := make(chan error, 1)
		go func() {
			_, err := p.Forward(t.Context(), addr, check(key, 1))
			errs <- err
		}()
		<-h.entered
		return errs
	}
	// The first forward connects, as a Forward RPC; the next go on the
	// stream, once the connection reports itself ready, until the held one.
	for _, key := range []string{"first", "second"} {
		errs := forward(key)
		h.block <- struct{}{}
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		awaitReported(t, p, addr)
	}
	if streams.Load() != 1 {
		t.Fatalf("%d streams opened, want 1", streams.Load())
	}
	held := forward("held")
	srv.Drain()
	h.block <- struct{}{}
	if err := <-held; err != nil {
		t.Errorf("the batch in flight as the peer drained: %v", err)
	}
	for i := range 3 {
		errs := forward(fmt.Sprint("after", i))
		h.block <- struct{}{}
		if err := <-errs; err != nil {
			t.Errorf("forward %d after the drain: %v", i, err)
		}
	}
	if streams.Load() != 1 {
		t.Errorf("%d streams opened, want no new one after the drain", streams.Load())
	}
}
