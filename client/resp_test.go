package client

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/api"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/resp"
	"github.com/ringlimit/ringlimit/service"
)

// respNode is a one-node ringlimit on loopback serving gRPC and RESP, as
// rlnode does with --resp-addr: its CheckStreams name the RESP port, and
// it counts the RL.CHECK commands and the stream's requests it answers.
type respNode struct {
	grpcAddr string
	resp     *resp.Server
	face     *api.Server
	commands atomic.Int64 // RL.CHECK commands answered
	messages atomic.Int64 // CheckStream requests received
}

func serveRESP(t testing.TB) *respNode {
	t.Helper()
	n := &respNode{}
	rlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	glis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(service.Config{})
	n.face = api.New(api.Config{Checker: svc, RESPPort: rlis.Addr().(*net.TCPAddr).Port})
	n.resp = resp.New(resp.Config{Checker: svc, Native: countingNative{n.face, &n.commands}})
	go n.resp.Serve(rlis)
	t.Cleanup(func() { n.resp.Shutdown(context.Background()) })
	srv := grpc.NewServer(append(api.ServerOptions(),
		grpc.ChainStreamInterceptor(func(s any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(s, countingStream{ss, &n.messages})
		}))...)
	n.face.RegisterGRPC(srv)
	go srv.Serve(glis)
	t.Cleanup(srv.Stop)
	n.grpcAddr = glis.Addr().String()
	return n
}

type countingNative struct {
	*api.Server
	n *atomic.Int64
}

func (c countingNative) RESPCheck(ctx context.Context, req *pb.CheckStreamRequest) *pb.CheckStreamResponse {
	c.n.Add(1)
	return c.Server.RESPCheck(ctx, req)
}

// untilRESP calls Allow until a check has gone by RL.CHECK: the first
// goes on the stream, which names the port, and the next ones while the
// client connects to it.
func untilRESP(t *testing.T, c *Client, n *respNode, l Limit) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; n.commands.Load() == 0; i++ {
		if _, err := c.Allow(context.Background(), l, "warm"); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no RL.CHECK after %d checks in 5s", i+1)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestChecksGoToTheRESPPort: once a node's stream names its RESP port, a
// plaintext client's checks go there as RL.CHECK, and mean what they
// meant on the stream: the same counters, decisions, invalid checks'
// errors and deadlines.
func TestChecksGoToTheRESPPort(t *testing.T) {
	n := serveRESP(t)
	c, err := New(n.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l := Limit{Name: "r", Count: 2, Period: time.Minute}
	untilRESP(t, c, n, l)
	before, messages := n.commands.Load(), n.messages.Load()
	ctx := context.Background()
	for i, want := range []bool{true, true, false} {
		d, err := c.Take(ctx, l, "k", 1)
		if err != nil || d.Allowed != want || d.Limit != 2 {
			t.Fatalf("check %d: %+v, %v; want allowed %v of a limit of 2", i, d, err, want)
		}
	}
	if _, err := c.Allow(ctx, Limit{Name: "r", Count: -1, Period: time.Minute}, "k"); !errors.Is(err, ErrInvalid) {
		t.Errorf("an invalid limit: %v, want ErrInvalid", err)
	}
	if got := n.commands.Load() - before; got != 4 {
		t.Errorf("%d RL.CHECK commands for 4 checks", got)
	}
	if got := n.messages.Load() - messages; got != 0 {
		t.Errorf("%d stream requests besides", got)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Allow(done, l, "k"); !errors.Is(err, context.Canceled) {
		t.Errorf("a caller gone: %v", err)
	}
}

// TestRESPPortGoneFallsBackToTheStream: when the RESP port stops
// answering, checks go on the stream again, none failing.
func TestRESPPortGoneFallsBackToTheStream(t *testing.T) {
	n := serveRESP(t)
	c, err := New(n.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l := Limit{Name: "r", Count: 1000, Period: time.Minute}
	untilRESP(t, c, n, l)
	if err := n.resp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	messages := n.messages.Load()
	for i := range 10 {
		if ok, err := c.Allow(context.Background(), l, "k"); err != nil || !ok {
			t.Fatalf("check %d after the RESP port closed: %v, %v", i, ok, err)
		}
	}
	if n.messages.Load() == messages {
		t.Error("no check went on the stream after the RESP port closed")
	}
}

// TestClientsWithOptionsStayOnGRPC: a client given dial options (TLS,
// credentials, interceptors), or WithoutStreams, never sends to the RESP
// port, which would not carry what they add.
func TestClientsWithOptionsStayOnGRPC(t *testing.T) {
	n := serveRESP(t)
	var intercepted atomic.Int64
	withOpts, err := Open([]string{n.grpcAddr}, WithDialOptions(grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, d *grpc.StreamDesc, cc *grpc.ClientConn, m string, s grpc.Streamer, o ...grpc.CallOption) (grpc.ClientStream, error) {
			intercepted.Add(1)
			return s(ctx, d, cc, m, o...)
		})))
	if err != nil {
		t.Fatal(err)
	}
	defer withOpts.Close()
	noStreams, err := Open([]string{n.grpcAddr}, WithoutStreams())
	if err != nil {
		t.Fatal(err)
	}
	defer noStreams.Close()
	l := Limit{Name: "r", Count: 1000, Period: time.Minute}
	for range 50 {
		for _, c := range []*Client{withOpts, noStreams} {
			if _, err := c.Allow(context.Background(), l, "k"); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Millisecond)
	}
	if got := n.commands.Load(); got != 0 {
		t.Errorf("%d RL.CHECK commands, want none", got)
	}
	if intercepted.Load() == 0 {
		t.Error("the interceptor saw no stream")
	}
}

// TestNodeWithoutRESPKeepsTheStream: a node whose stream names no RESP
// port (none configured, or an older version) gets the checks on the
// stream, as before.
func TestNodeWithoutRESPKeepsTheStream(t *testing.T) {
	node, addr := serveCounted(t)
	c, err := New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 20 {
		if _, err := c.Allow(context.Background(), streamed, "k"); err != nil {
			t.Fatal(err)
		}
	}
	if node.messages.Load() == 0 {
		t.Error("no check on the stream")
	}
}
