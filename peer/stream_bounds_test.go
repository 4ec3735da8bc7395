package peer

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/mux"
	"github.com/ringlimit/ringlimit/internal/peerpb"
)

// handlers counts a server's stream handlers: opened, and running.
type handlers struct{ opened, running atomic.Int64 }

// boundedStreams serves h with its ForwardStreams bounded by b (its Ended
// wrapped to send each reason to the returned channel) and returns the
// server's address and its stream handlers, which a stream interceptor
// counts.
func boundedStreams(t *testing.T, h Handler, b StreamBounds) (addr string, ended <-chan error, hs *handlers) {
	t.Helper()
	endedCh := make(chan error, 16)
	b.Ended = func(_ context.Context, reason error) { endedCh <- reason }
	srv := NewServer(h, nil)
	srv.BoundStreams(b)
	hs = &handlers{}
	addr = serveService(t, srv, grpc.ChainStreamInterceptor(func(s any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		hs.opened.Add(1)
		hs.running.Add(1)
		defer hs.running.Add(-1)
		return handler(s, ss)
	}))
	return addr, endedCh, hs
}

// openStream opens a ForwardStream on a connection of its own whose
// receive windows are the smallest gRPC allows (64 KiB), so that a few
// large answers fill them.
func openStream(t *testing.T, addr string) peerpb.Peer_ForwardStreamClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	// The stream's own deadline only keeps a failing test from hanging.
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), SenderHeader, "a"), time.Minute)
	t.Cleanup(cancel)
	s, err := peerpb.NewPeerClient(cc).ForwardStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// bigAnswers answers each request with 1,000 results of 100-byte errors:
// about 110 KB an answer.
func bigAnswers(reqs []*pb.CheckRequest) []*pb.CheckResponse {
	out := make([]*pb.CheckResponse, len(reqs))
	for i := range reqs {
		out[i] = &pb.CheckResponse{Responses: make([]*pb.CheckResult, 1000)}
		for j := range out[i].Responses {
			out[i].Responses[j] = &pb.CheckResult{Error: strings.Repeat("e", 100)}
		}
	}
	return out
}

// waitFor waits up to 20s for what to be true, and fails the test if it
// is not: long enough for a loaded machine, as the bound asserted is that
// it happens, not how soon.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20s", what)
		}
	}
}

// endedFor waits up to 20s for the server to report a stream ended, and
// returns why.
func endedFor(t *testing.T, ended <-chan error) error {
	t.Helper()
	select {
	case err := <-ended:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("no stream ended within 20s")
		return nil
	}
}

// recvEnd reads s to its end and returns how it ended.
func recvEnd(s peerpb.Peer_ForwardStreamClient) error {
	for {
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
}

// TestForwardStreamUnreadIsEnded: a sender that sends batches and reads
// none of their answers (its receive window fills, and the server's send
// blocks) has its stream ended once an answer has waited SendTimeout: the
// server's stream handler returns, Ended is told ErrNotRead, and the
// sender, reading at last, finds the stream ended DEADLINE_EXCEEDED with
// the trailer saying why. Before BoundStreams, the handler stayed blocked
// for as long as the sender liked.
func TestForwardStreamUnreadIsEnded(t *testing.T) {
	addr, ended, hs := boundedStreams(t, &fakeHandler{answer: bigAnswers}, StreamBounds{SendTimeout: 200 * time.Millisecond})
	s := openStream(t, addr)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		// Twenty answers of 110 KB, far beyond the 64 KiB windows: once
		// the server stops reading (a send blocked, mux.Workers
		// deciding), these sends block too, until the stream ends.
		for id := range 20 {
			if s.Send(&peerpb.ForwardStreamRequest{Id: uint64(id + 1), Requests: []*pb.CheckRequest{check("k", 1)}}) != nil {
				return
			}
		}
	}()
	if err := endedFor(t, ended); !errors.Is(err, mux.ErrNotRead) {
		t.Fatalf("the stream ended for %v, want ErrNotRead", err)
	}
	waitFor(t, "the stream's handler returns", func() bool { return hs.running.Load() == 0 })
	<-sent
	err := recvEnd(s)
	if why := s.Trailer().Get(mux.EndedTrailer); status.Code(err) != codes.DeadlineExceeded || len(why) != 1 || why[0] != status.Convert(mux.ErrNotRead).Message() {
		t.Errorf("the sender's stream ended with %v, trailer %q; want DEADLINE_EXCEEDED and ErrNotRead's message", err, why)
	}
}

// TestForwardStreamIdleIsEnded: a stream without a batch for half its
// IdleTimeout is asked to end (a notice, id 0, ErrIdle); a sender that
// ignores it, or that never sent anything, has it ended at IdleTimeout,
// DEADLINE_EXCEEDED with the trailer saying why, and the handler returns.
func TestForwardStreamIdleIsEnded(t *testing.T) {
	for _, first := range []bool{true, false} {
		t.Run(map[bool]string{true: "after a batch", false: "nothing sent"}[first], func(t *testing.T) {
			addr, ended, hs := boundedStreams(t, &fakeHandler{}, StreamBounds{SendTimeout: time.Second, IdleTimeout: 200 * time.Millisecond})
			s := openStream(t, addr)
			if first {
				if err := s.Send(&peerpb.ForwardStreamRequest{Id: 1, Requests: []*pb.CheckRequest{check("k", 1)}}); err != nil {
					t.Fatal(err)
				}
				if resp, err := s.Recv(); err != nil || resp.GetId() != 1 {
					t.Fatalf("the first batch: %v, %v", resp, err)
				}
			}
			notice, err := s.Recv()
			if err != nil || notice.GetId() != 0 || !errors.Is(mux.Err(notice.GetStatus()), mux.ErrIdle) {
				t.Fatalf("after the stream idled: %v, %v; want a notice of id 0 with ErrIdle", notice, err)
			}
			if err := endedFor(t, ended); !errors.Is(err, mux.ErrIdle) {
				t.Fatalf("the stream ended for %v, want ErrIdle", err)
			}
			err = recvEnd(s)
			if why := s.Trailer().Get(mux.EndedTrailer); status.Code(err) != codes.DeadlineExceeded || len(why) != 1 || why[0] != status.Convert(mux.ErrIdle).Message() {
				t.Errorf("the sender's stream ended with %v, trailer %q; want DEADLINE_EXCEEDED and ErrIdle's message", err, why)
			}
			waitFor(t, "the stream's handler returns", func() bool { return hs.running.Load() == 0 })
		})
	}
}

// TestForwardStreamBusyIsNotEnded: a sender that sends a batch every few
// milliseconds, with answers of 110 KB that it reads as they come, keeps
// its stream for many times both timeouts: no notice, no end.
func TestForwardStreamBusyIsNotEnded(t *testing.T) {
	const idle = time.Second
	addr, ended, hs := boundedStreams(t, &fakeHandler{answer: bigAnswers}, StreamBounds{SendTimeout: idle, IdleTimeout: idle})
	s := openStream(t, addr)
	// Three idle periods, at most 300 batches: a notice would come after
	// one, an end after two.
	for id, until := uint64(1), time.Now().Add(3*idle); id <= 300 && time.Now().Before(until); id++ {
		if err := s.Send(&peerpb.ForwardStreamRequest{Id: id, Requests: []*pb.CheckRequest{check("k", 1)}}); err != nil {
			t.Fatalf("batch %d: %v", id, err)
		}
		resp, err := s.Recv()
		if err != nil || resp.GetId() != id {
			t.Fatalf("batch %d: %v, %v; want its answer", id, resp, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-ended:
		t.Fatalf("a busy stream was ended: %v", err)
	default:
	}
	if hs.running.Load() != 1 {
		t.Errorf("%d stream handlers running, want the busy stream's", hs.running.Load())
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := recvEnd(s); !errors.Is(err, io.EOF) {
		t.Errorf("the busy stream, closed by its sender: %v, want io.EOF", err)
	}
}

// TestPoolStreamIdle: the Pool's stream to a peer that ends idle streams
// is asked to end and does, and the Pool's later forwards are answered
// (as Forward RPCs, then on a new stream).
func TestPoolStreamIdle(t *testing.T) {
	addr, ended, hs := boundedStreams(t, &fakeHandler{}, StreamBounds{SendTimeout: time.Second, IdleTimeout: 100 * time.Millisecond})
	p, _ := startPool(t, Config{Name: "me"})
	for i := range 2 { // the first connects by a Forward RPC, the second opens the stream
		if resp, err := p.Forward(t.Context(), addr, check("k", 1)); err != nil || keyOf(resp) != "k" {
			t.Fatalf("forward %d: %v, %v", i, resp, err)
		}
	}
	if hs.opened.Load() != 1 {
		t.Fatalf("%d streams opened, want the Pool's", hs.opened.Load())
	}
	waitFor(t, "the idle stream ends", func() bool { return hs.running.Load() == 0 })
	select {
	case err := <-ended:
		t.Errorf("the Pool's stream was ended (%v), want the Pool to end it when asked", err)
	default:
	}
	for i := range 3 {
		if resp, err := p.Forward(t.Context(), addr, check("k", 1)); err != nil || keyOf(resp) != "k" {
			t.Fatalf("forward %d after the stream idled: %v, %v", i, resp, err)
		}
	}
}
