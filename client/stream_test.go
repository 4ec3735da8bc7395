package client

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/ringlimit/ringlimit/api"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/service"
)

// counted is a one-node ringlimit on loopback that counts the Check RPCs
// and the CheckStream requests it receives, and the metadata key "who" of
// the Check RPCs.
type counted struct {
	api            *api.Server
	rpcs, messages atomic.Int64
	mu             sync.Mutex
	who            []string
}

func serveCounted(t *testing.T) (*counted, string) {
	t.Helper()
	c := &counted{api: api.New(api.Config{Checker: service.New(service.Config{})})}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts := append(api.ServerOptions(),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if _, ok := req.(*pb.CheckRequest); ok {
				c.rpcs.Add(1)
				c.mu.Lock()
				c.who = append(c.who, metadata.ValueFromIncomingContext(ctx, "who")...)
				c.mu.Unlock()
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, countingStream{ss, &c.messages})
		}))
	srv := grpc.NewServer(opts...)
	c.api.RegisterGRPC(srv)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return c, lis.Addr().String()
}

type countingStream struct {
	grpc.ServerStream
	n *atomic.Int64
}

func (s countingStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil {
		s.n.Add(1)
	}
	return err
}

var streamed = Limit{Name: "s", Count: 1000, Period: time.Minute}

// TestChecksGoOnTheStream: once connected, a client's checks travel on a
// CheckStream; with WithoutStreams, and for a lone caller whose context
// carries metadata, in Check RPCs, the metadata with them.
func TestChecksGoOnTheStream(t *testing.T) {
	node, addr := serveCounted(t)
	c, err := New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The first checks connect, in RPCs (the stream waits for the
	// connection to be up).
	for deadline := time.Now().Add(10 * time.Second); node.messages.Load() == 0; {
		if ok, err := c.Allow(context.Background(), streamed, "k"); !ok || err != nil {
			t.Fatalf("Allow = %v, %v", ok, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no check on the stream within 10s (%d RPCs)", node.rpcs.Load())
		}
	}
	rpcs, msgs := node.rpcs.Load(), node.messages.Load()
	for range 10 {
		if ok, err := c.Allow(context.Background(), streamed, "k"); !ok || err != nil {
			t.Fatalf("Allow = %v, %v", ok, err)
		}
	}
	if rpcs, msgs := node.rpcs.Load()-rpcs, node.messages.Load()-msgs; rpcs != 0 || msgs != 10 {
		t.Errorf("10 checks once connected: %d Check RPCs and %d stream requests, want 0 and 10", rpcs, msgs)
	}
	rpcs = node.rpcs.Load()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "who", "caller")
	if ok, err := c.Allow(ctx, streamed, "k"); !ok || err != nil {
		t.Fatalf("Allow with metadata = %v, %v", ok, err)
	}
	node.mu.Lock()
	who := node.who
	node.mu.Unlock()
	if node.rpcs.Load() != rpcs+1 || len(who) != 1 || who[0] != "caller" {
		t.Errorf("a lone caller with metadata: %d RPCs, metadata %v; want its own RPC, with its metadata", node.rpcs.Load()-rpcs, who)
	}

	plain, err := Open([]string{addr}, WithoutStreams())
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	before := node.messages.Load()
	for range 5 {
		if ok, err := plain.Allow(context.Background(), streamed, "k"); !ok || err != nil {
			t.Fatalf("Allow without streams = %v, %v", ok, err)
		}
	}
	if node.messages.Load() != before {
		t.Errorf("a client WithoutStreams sent %d stream requests", node.messages.Load()-before)
	}
}

// TestDrainingNodeStillAnswers: checks in flight when a node drains its
// streams are answered, and the later ones go in Check RPCs.
func TestDrainingNodeStillAnswers(t *testing.T) {
	node, addr := serveCounted(t)
	c, err := New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		if _, err := c.Allow(context.Background(), streamed, "k"); err != nil {
			t.Fatal(err)
		}
	}
	node.api.Drain()
	rpcs := node.rpcs.Load()
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if ok, err := c.Allow(context.Background(), streamed, "d"); !ok || err != nil {
				t.Errorf("Allow while the node drains = %v, %v", ok, err)
			}
		})
	}
	wg.Wait()
	for deadline := time.Now().Add(10 * time.Second); node.rpcs.Load() == rpcs; time.Sleep(time.Millisecond) {
		if _, err := c.Allow(context.Background(), streamed, "later"); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("no Check RPC within 10s of the drain: the client kept to the stream")
		}
	}
}
