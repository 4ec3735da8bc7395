package peer

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/internal/peerpb"
)

// calledMethods records the full method name of every call a server
// serves, before its guard judges it (the server's tap is
// ServerOptions').
type calledMethods struct {
	mu    sync.Mutex
	names []string
}

func (c *calledMethods) record(method string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.names = append(c.names, method)
}

func (c *calledMethods) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c.record(info.FullMethod)
	return handler(ctx, req)
}

func (c *calledMethods) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	c.record(info.FullMethod)
	return handler(srv, ss)
}

func (c *calledMethods) called(method string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.names, method)
}

// serveLegacy serves h as a node of the version before the Peer service
// moved to internal/peerpb does: under LegacyServiceName alone, guarded
// as every peer server is, with m as its members.
func serveLegacy(t *testing.T, h Handler, m members, calls *calledMethods) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := NewGuard(GuardConfig{Members: m})
	srv := grpc.NewServer(append(ServerOptions(),
		grpc.ChainUnaryInterceptor(calls.unary, g.Unary), grpc.ChainStreamInterceptor(calls.stream, g.Stream))...)
	srv.RegisterService(legacyDesc(), NewServer(h, nil))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return lis.Addr().String()
}

// TestPoolCallsALegacyPeer: a node of the previous version, which knows
// the Peer service only as ringlimit.v1.Peer, gets every call of a Pool
// of this version, and the batches of its forwards on a stream once the
// Pool has found which name the node knows.
func TestPoolCallsALegacyPeer(t *testing.T) {
	h := &fakeHandler{}
	var calls calledMethods
	addr := serveLegacy(t, h, members{"me", "owner"}, &calls)
	p, _ := startPool(t, Config{Name: "me"})
	unaryCalls(t, p, addr, h)
	for i := range 5 {
		resp, err := p.Forward(t.Context(), addr, check("k", 1))
		if err != nil || keyOf(resp) != "k" {
			t.Fatalf("forward %d: %v, %v", i, resp, err)
		}
	}
	if !calls.called("/" + LegacyServiceName + "/ForwardStream") {
		t.Errorf("the pool never opened a stream under %s; calls: %v", LegacyServiceName, calls.names)
	}
}

// TestLegacyPeerCallsServer: a node of the previous version calls this
// version's Server under the name it knows, and is served.
func TestLegacyPeerCallsServer(t *testing.T) {
	h := &fakeHandler{}
	addr := serve(t, h)
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	resp := new(peerpb.ForwardResponse)
	err = cc.Invoke(t.Context(), "/"+LegacyServiceName+"/Forward", &peerpb.ForwardRequest{Requests: requests(1, 1)}, resp)
	if err != nil || len(resp.GetResponses()) != 1 || keyOf(resp.GetResponses()[0]) != "k0" {
		t.Fatalf("Forward under %s = %v, %v; want the answer for k0", LegacyServiceName, resp, err)
	}
	err = cc.Invoke(t.Context(), "/ringlimit.v0.Peer/Forward", &peerpb.ForwardRequest{}, resp)
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("Forward under a name never served = %v, want Unimplemented", err)
	}
}

func TestLegacyMethod(t *testing.T) {
	for _, tc := range []struct {
		method, want string
		ok           bool
	}{
		{"/ringlimit.peer.v1.Peer/Forward", "/ringlimit.v1.Peer/Forward", true},
		{"/ringlimit.peer.v1.Peer/ForwardStream", "/ringlimit.v1.Peer/ForwardStream", true},
		{"/ringlimit.peer.v1.Peer/Lease", "", false}, // new since the rename: no old node serves it
		{"/ringlimit.v1.RateLimiter/Check", "", false},
		{"/grpc.health.v1.Health/Check", "", false},
	} {
		if got, ok := legacyMethod(tc.method); got != tc.want || ok != tc.ok {
			t.Errorf("legacyMethod(%q) = %q, %v; want %q, %v", tc.method, got, ok, tc.want, tc.ok)
		}
	}
}
