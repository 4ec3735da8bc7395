package mux

import (
	"context"
	"errors"
	"io"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// stalled is a stream whose client sends what the test puts in in, and
// reads an answer only when the test takes it from out: as gRPC's flow
// control does for a client that stops reading, Send blocks until it does,
// or until the RPC's context ends.
type stalled struct {
	grpc.ServerStream
	ctx     context.Context
	in      chan *pb.CheckStreamRequest // closed: the client ended its side
	out     chan *pb.CheckStreamResponse
	trailer metadata.MD // read once Serve has returned
}

func (s *stalled) SetTrailer(md metadata.MD) { s.trailer = metadata.Join(s.trailer, md) }

func newStalled() *stalled {
	return &stalled{ctx: Stoppable(context.Background()), in: make(chan *pb.CheckStreamRequest), out: make(chan *pb.CheckStreamResponse)}
}

func (s *stalled) Context() context.Context { return s.ctx }

func (s *stalled) Recv() (*pb.CheckStreamRequest, error) {
	select {
	case r, ok := <-s.in:
		if !ok {
			return nil, io.EOF
		}
		return r, nil
	case <-s.ctx.Done():
		return nil, status.FromContextError(s.ctx.Err()).Err()
	}
}

func (s *stalled) Send(r *pb.CheckStreamResponse) error {
	select {
	case s.out <- r:
		return nil
	case <-s.ctx.Done():
		return status.FromContextError(s.ctx.Err()).Err()
	}
}

// slotServer answers at once, unless a request's key is "wait": then it
// waits for release or the request's end.
func slotServer(send, idle time.Duration, release <-chan struct{}) *Server[pb.CheckStreamRequest, pb.CheckStreamResponse] {
	return &Server[pb.CheckStreamRequest, pb.CheckStreamResponse]{
		Timeout: func(*pb.CheckStreamRequest) time.Duration { return 0 },
		Handle: func(ctx context.Context, req *pb.CheckStreamRequest) *pb.CheckStreamResponse {
			if req.GetRequests()[0].GetKey() == "wait" {
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			return &pb.CheckStreamResponse{Id: req.GetId()}
		},
		Notice:      func(reason error) *pb.CheckStreamResponse { return &pb.CheckStreamResponse{Status: Status(reason)} },
		SendTimeout: send,
		IdleTimeout: idle,
	}
}

// serveStalled runs sr.Serve(s) and returns where its result arrives.
func serveStalled(sr *Server[pb.CheckStreamRequest, pb.CheckStreamResponse], s *stalled) <-chan error {
	served := make(chan error, 1)
	go func() { served <- sr.Serve(s) }()
	return served
}

// ended returns what Serve returned, or false if it has not returned.
func ended(served <-chan error) (error, bool) {
	synctest.Wait()
	select {
	case err := <-served:
		return err, true
	default:
		return nil, false
	}
}

// TestUnreadAnswersEndTheStream: a client that sends requests and reads
// no answers has its stream ended, RESOURCE_EXHAUSTED, once an answer
// has waited SendTimeout (at most a quarter more), though the send is
// blocked; the stream's RPC context ends with it, which gives its slot
// back, the trailer says why, and Ended is told.
func TestUnreadAnswersEndTheStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newStalled()
		sr := slotServer(10*time.Second, 0, nil)
		var endedFor []error
		sr.Ended = func(ctx context.Context, reason error) {
			if ctx != s.ctx {
				t.Error("Ended was not given the stream's context")
			}
			endedFor = append(endedFor, reason)
		}
		served := serveStalled(sr, s)
		s.in <- request("k", 1)
		time.Sleep(10 * time.Second)
		if err, ok := ended(served); ok {
			t.Fatalf("Serve returned %v with its answer blocked for 10s, want it to go on until more than SendTimeout", err)
		}
		time.Sleep(2600 * time.Millisecond)
		err, ok := ended(served)
		if !ok || !errors.Is(err, ErrNotRead) || status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("Serve after its answer was blocked for 12.6s: %v (returned %v), want ErrNotRead", err, ok)
		}
		if !errors.Is(s.ctx.Err(), context.DeadlineExceeded) {
			t.Errorf("the RPC's context: %v, want it ended (its slot given back), DeadlineExceeded for gRPC's status", s.ctx.Err())
		}
		if got := s.trailer.Get(EndedTrailer); len(got) != 1 || got[0] != status.Convert(ErrNotRead).Message() {
			t.Errorf("trailer %s: %q, want ErrNotRead's message", EndedTrailer, got)
		}
		if len(endedFor) != 1 || !errors.Is(endedFor[0], ErrNotRead) {
			t.Errorf("Ended called with %v, want once with ErrNotRead", endedFor)
		}
	})
}

// TestIdleStreamIsAskedToEnd: a stream with no request for half its
// IdleTimeout is asked to end (a Notice with ErrIdle); a client that does
// so ends Serve with nil, one that does not has the stream ended with
// ErrIdle at IdleTimeout, not later: the slot is given back at the time
// the flag states (before, the notice came at IdleTimeout and the end at
// twice it, at most a quarter of SendTimeout later). A stream whose
// request is being decided is not idle, however long the request takes.
func TestIdleStreamIsAskedToEnd(t *testing.T) {
	const idle = time.Minute
	// noticed takes the notice, failing if there is none.
	noticed := func(t *testing.T, s *stalled) {
		t.Helper()
		synctest.Wait()
		select {
		case notice := <-s.out:
			if !errors.Is(Err(notice.GetStatus()), ErrIdle) || notice.GetId() != 0 {
				t.Errorf("notice %v, want id 0 and ErrIdle", notice)
			}
		default:
			t.Fatal("no notice after the stream was idle for half IdleTimeout")
		}
	}
	t.Run("client ends", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := newStalled()
			served := serveStalled(slotServer(10*time.Second, idle, nil), s)
			time.Sleep(idle/2 - time.Millisecond)
			synctest.Wait()
			select {
			case r := <-s.out:
				t.Fatalf("%v sent before the stream was idle for half IdleTimeout", r)
			default:
			}
			time.Sleep(time.Millisecond)
			noticed(t, s)
			close(s.in)
			if err, ok := ended(served); !ok || err != nil {
				t.Errorf("Serve after its client ended the stream: %v (returned %v), want nil", err, ok)
			}
		})
	})
	t.Run("client ignores it", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := newStalled()
			served := serveStalled(slotServer(10*time.Second, idle, nil), s)
			time.Sleep(idle / 2)
			noticed(t, s)
			time.Sleep(idle/2 - time.Millisecond)
			if err, ok := ended(served); ok {
				t.Fatalf("Serve returned %v before the stream was idle for IdleTimeout", err)
			}
			time.Sleep(time.Millisecond)
			err, ok := ended(served)
			if !ok || !errors.Is(err, ErrIdle) {
				t.Fatalf("Serve, idle for IdleTimeout: %v (returned %v), want ErrIdle", err, ok)
			}
			if !errors.Is(s.ctx.Err(), context.DeadlineExceeded) {
				t.Errorf("the RPC's context: %v, want it ended", s.ctx.Err())
			}
			if got := s.trailer.Get(EndedTrailer); len(got) != 1 || got[0] != status.Convert(ErrIdle).Message() {
				t.Errorf("trailer %s: %q, want ErrIdle's message", EndedTrailer, got)
			}
		})
	})
	t.Run("a request being decided", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := newStalled()
			release := make(chan struct{})
			served := serveStalled(slotServer(10*time.Second, idle, release), s)
			req := request("wait", 1)
			req.Id = 7
			s.in <- req
			time.Sleep(10 * idle)
			if err, ok := ended(served); ok {
				t.Fatalf("Serve returned %v while a request was being decided", err)
			}
			select {
			case r := <-s.out:
				t.Fatalf("sent %v while a request was being decided", r)
			default:
			}
			close(release)
			if r := <-s.out; r.GetId() != 7 {
				t.Errorf("the answer: %v", r)
			}
			close(s.in)
			if err, ok := ended(served); !ok || err != nil {
				t.Errorf("Serve: %v (returned %v), want nil", err, ok)
			}
		})
	})
}
