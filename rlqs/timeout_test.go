package rlqs_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/ringlimit/ringlimit/internal/mux"
	"github.com/ringlimit/ringlimit/rlqs"
)

// bounded is a quota server whose streams are bounded, served as a node
// serves it: its streams' RPC contexts come through mux.Stoppable (the
// node's tap), and an interceptor counts the stream handlers running.
type bounded struct {
	addr    string
	ended   chan error // each reason StreamEnded is told
	running atomic.Int64
}

func serveBounded(t *testing.T, sendTimeout, idleTimeout time.Duration) *bounded {
	t.Helper()
	b := &bounded{ended: make(chan error, 16)}
	s, err := rlqs.New(rlqs.Config{Leaser: &leaser{lend: 10}, Policies: loadPolicies(t),
		StreamSendTimeout: sendTimeout, StreamIdleTimeout: idleTimeout,
		StreamEnded: func(_ context.Context, reason error) { b.ended <- reason }})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.InTapHandle(func(ctx context.Context, info *tap.Info) (context.Context, error) {
			if info.FullMethodName == rlqs.Method {
				ctx = mux.Stoppable(ctx)
			}
			return ctx, nil
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			b.running.Add(1)
			defer b.running.Add(-1)
			return handler(srv, ss)
		}))
	s.Register(srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	b.addr = lis.Addr().String()
	return b
}

// client dials b on a connection of its own whose receive windows are
// the smallest gRPC allows (64 KiB), so that a few large messages fill
// them.
func (b *bounded) client(t *testing.T) rlqspb.RateLimitQuotaServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(b.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return rlqspb.NewRateLimitQuotaServiceClient(cc)
}

// endedFor waits up to 20s (a loaded machine's margin: what is asserted
// is that the stream ends, not how soon) for a stream to be ended, and
// returns why.
func (b *bounded) endedFor(t *testing.T) error {
	t.Helper()
	select {
	case err := <-b.ended:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("no stream ended within 20s")
		return nil
	}
}

// handlersReturn waits up to 20s for every stream handler to return.
func (b *bounded) handlersReturn(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); b.running.Load() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d stream handlers still running after 20s", b.running.Load())
		}
	}
}

// wideReport is a first report of 1,000 buckets with long ids, all
// ALLOW_ALL: the answer, and each renewal, is about 300 KB.
func wideReport() *rlqspb.RateLimitQuotaUsageReports {
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: "edge"}
	for i := range 1000 {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, usage(1, 0, "path", "/free", "tenant", fmt.Sprintf("%0200d", i)))
	}
	return m
}

// recvEnd reads st to its end and returns how it ended.
func recvEnd(st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient) error {
	for {
		if _, err := st.Recv(); err != nil {
			return err
		}
	}
}

// TestUnreadStreamIsEnded: an Envoy that reports and reads nothing (its
// receive window fills with the answer and the renewals, and the
// server's send blocks) has its stream ended once a send has waited
// StreamSendTimeout: the handler returns, StreamEnded is told
// mux.ErrNotRead, and the client, reading at last, finds the stream ended
// DEADLINE_EXCEEDED with the trailer saying why. Before, the handler
// stayed blocked, holding its slot of --rlqs-max-streams, its buckets and
// its accounts, for as long as the connection lived.
func TestUnreadStreamIsEnded(t *testing.T) {
	b := serveBounded(t, 200*time.Millisecond, 0)
	st := open(t, b.client(t))
	if err := st.Send(wideReport()); err != nil {
		t.Fatal(err)
	}
	if err := b.endedFor(t); !errors.Is(err, mux.ErrNotRead) {
		t.Fatalf("the stream ended for %v, want mux.ErrNotRead", err)
	}
	b.handlersReturn(t)
	err := recvEnd(st)
	if why := st.Trailer().Get(mux.EndedTrailer); status.Code(err) != codes.DeadlineExceeded || len(why) != 1 || why[0] != status.Convert(mux.ErrNotRead).Message() {
		t.Errorf("the client's stream ended with %v, trailer %q; want DEADLINE_EXCEEDED and ErrNotRead's message", err, why)
	}
}

// TestIdleStreamIsEnded: a stream that sends nothing, or nothing after
// its first report, for StreamIdleTimeout is ended DEADLINE_EXCEEDED,
// naming the flag, though the server's renewals went on; its handler
// returns.
func TestIdleStreamIsEnded(t *testing.T) {
	for _, first := range []bool{true, false} {
		t.Run(map[bool]string{true: "after a report", false: "nothing sent"}[first], func(t *testing.T) {
			b := serveBounded(t, time.Second, 300*time.Millisecond)
			st := open(t, b.client(t))
			if first {
				send(t, st, "edge", usage(1, 0, "tenant", "a", "path", "/free"))
				recv(t, st)
			}
			// The client reads all the while: only its silence ends it.
			err := recvEnd(st)
			if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "--stream-idle-timeout") {
				t.Fatalf("the idle stream ended with %v, want DEADLINE_EXCEEDED naming --stream-idle-timeout", err)
			}
			if reason := b.endedFor(t); status.Code(reason) != codes.DeadlineExceeded {
				t.Errorf("StreamEnded told %v, want the idle status", reason)
			}
			b.handlersReturn(t)
		})
	}
}

// TestBusyStreamIsNotEnded: an Envoy that reports every 20 ms, and reads
// as it goes, keeps its stream for three times both bounds.
func TestBusyStreamIsNotEnded(t *testing.T) {
	const bound = time.Second
	b := serveBounded(t, bound, bound)
	st := open(t, b.client(t))
	read := make(chan error, 1)
	go func() { read <- recvEnd(st) }()
	for i, until := 0, time.Now().Add(3*bound); i < 300 && time.Now().Before(until); i++ {
		domain := ""
		if i == 0 {
			domain = "edge"
		}
		send(t, st, domain, usage(1, 0, "tenant", "a", "path", "/free"))
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-b.ended:
		t.Fatalf("a busy stream was ended: %v", err)
	case err := <-read:
		t.Fatalf("a busy stream ended: %v", err)
	default:
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := <-read; !errors.Is(err, io.EOF) {
		t.Errorf("the busy stream, closed by its client: %v, want io.EOF", err)
	}
	b.handlersReturn(t)
}
