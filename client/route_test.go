package client_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/api"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/service"
)

// staticCluster is nodes on loopback that answer Members with a ring the
// test sets, each deciding whatever it receives with a store of its own:
// they never forward, so what each received shows where the client sent
// it. (cmd/rlnode's tests run the client against real clusters.)
type staticCluster struct {
	members []ring.Member
	servers []*grpc.Server
	ring    atomic.Pointer[ring.Ring]

	mu   sync.Mutex
	keys [][]string // keys each node received in Check RPCs
	// unrecorded stops the recording of keys, for benchmarks.
	unrecorded atomic.Bool
}

func newStaticCluster(t testing.TB, n int) *staticCluster {
	t.Helper()
	c := &staticCluster{keys: make([][]string, n)}
	for i := range n {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		record := func(items []*pb.CheckItem) {
			if c.unrecorded.Load() {
				return
			}
			c.mu.Lock()
			for _, it := range items {
				c.keys[i] = append(c.keys[i], it.Key)
			}
			c.mu.Unlock()
		}
		srv := grpc.NewServer(grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if r, ok := req.(*pb.CheckRequest); ok {
				record(r.Requests)
			}
			return h(ctx, req)
		}), grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, recordingStream{ss, record})
		}))
		api.New(api.Config{Checker: service.New(service.Config{}), Ring: c.ring.Load}).RegisterGRPC(srv)
		go srv.Serve(lis)
		t.Cleanup(srv.Stop)
		c.servers = append(c.servers, srv)
		c.members = append(c.members, ring.Member{Name: fmt.Sprint("node-", i), GRPCAddr: lis.Addr().String()})
	}
	c.ring.Store(ring.New(c.members...))
	return c
}

// recordingStream records the keys of the checks a CheckStream receives.
type recordingStream struct {
	grpc.ServerStream
	record func([]*pb.CheckItem)
}

func (s recordingStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if r, ok := m.(*pb.CheckStreamRequest); ok && err == nil {
		s.record(r.Requests)
	}
	return err
}

func (c *staticCluster) addrs() []string {
	var a []string
	for _, m := range c.members {
		a = append(a, m.GRPCAddr)
	}
	return a
}

// received returns the keys each node received since the last call.
func (c *staticCluster) received() [][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	got := c.keys
	c.keys = make([][]string, len(got))
	return got
}

// misrouted returns the keys a node received that the ring gives another.
func (c *staticCluster) misrouted(r *ring.Ring) []string {
	var bad []string
	for i, keys := range c.received() {
		for _, k := range keys {
			if o, _ := r.Owner(k); o.Name != c.members[i].Name {
				bad = append(bad, fmt.Sprintf("%s at node-%d (owner %s)", k, i, o.Name))
			}
		}
	}
	return bad
}

// routingClient opens a client of every node of sc, which routes, and
// waits until it has learned their ring.
func (sc *staticCluster) routingClient(t testing.TB, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.Open(sc.addrs(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	learned(t, c, len(sc.members))
	return c
}

// learned polls until c's ring has want members, sending a check now and
// then, as a client in use does.
func learned(t testing.TB, c *client.Client, want int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); c.Ring().Len() != want; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the client's ring has %d members after 10s, want %d", c.Ring().Len(), want)
		}
		c.Allow(context.Background(), client.Limit{Name: "poke", Count: 1 << 20, Period: time.Minute}, "poke")
	}
}

var routed = client.Limit{Name: "routed", Count: 10, Period: time.Minute}

func TestRoutesEachCheckToItsOwner(t *testing.T) {
	sc := newStaticCluster(t, 3)
	c, err := client.Open(sc.addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Ring() != nil {
		t.Error("the client has a ring before it asked for one")
	}
	learned(t, c, 3)
	sc.received()

	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Go(func() {
			if ok, err := c.Allow(ctx, routed, fmt.Sprint("user:", i)); !ok || err != nil {
				t.Errorf("Allow user:%d = %v, %v", i, ok, err)
			}
		})
	}
	wg.Wait()
	// A request of several checks is split by owner, and answered in order.
	req := &pb.CheckRequest{}
	for i := range 12 {
		req.Requests = append(req.Requests, &pb.CheckItem{Name: "split", Key: fmt.Sprint("k", i), Limit: int64(i + 1), DurationMs: 60_000})
	}
	resp, err := c.Check(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range resp.Responses {
		if r.Limit != int64(i+1) || r.Status != pb.Status_UNDER_LIMIT {
			t.Errorf("result %d: %v, want the answer to its own check", i, r)
		}
	}
	if bad := sc.misrouted(sc.ring.Load()); len(bad) > 0 {
		t.Errorf("checks sent to a node that does not own them: %v", bad)
	}
}

// TestWhereChecksGoWithoutAnOwner: LOCAL and GLOBAL checks, which any node
// decides, go to the first address, and a request with "all" set goes
// whole, where its first check goes.
func TestWhereChecksGoWithoutAnOwner(t *testing.T) {
	sc := newStaticCluster(t, 3)
	c := sc.routingClient(t)
	r := sc.ring.Load()
	var notFirst []string // keys node-0 does not own
	for k := 0; len(notFirst) < 2; k++ {
		if o, _ := r.Owner(fmt.Sprint("x", k)); o.Name != "node-0" {
			notFirst = append(notFirst, fmt.Sprint("x", k))
		}
	}
	sc.received()

	ctx := context.Background()
	for _, b := range []pb.Behavior{pb.Behavior_LOCAL, pb.Behavior_GLOBAL} {
		l := client.Limit{Name: b.String(), Count: 5, Period: time.Minute, Behavior: b}
		if _, err := c.Take(ctx, l, notFirst[0], 1); err != nil {
			t.Fatal(err)
		}
	}
	if got := sc.received(); !slices.Equal(got[0], []string{notFirst[0], notFirst[0]}) {
		t.Errorf("nodes received %v, want both checks at node-0", got)
	}

	owner1, _ := r.Owner(notFirst[1])
	all := &pb.CheckRequest{All: true, Requests: []*pb.CheckItem{
		{Name: "a", Key: notFirst[1], Limit: 5, DurationMs: 60_000},
		{Name: "b", Key: "other", Limit: 5, DurationMs: 60_000},
	}}
	if _, err := c.Check(ctx, all); err != nil {
		t.Fatal(err)
	}
	for i, keys := range sc.received() {
		want := []string(nil)
		if sc.members[i].Name == owner1.Name {
			want = []string{notFirst[1], "other"}
		}
		if !slices.Equal(keys, want) {
			t.Errorf("node-%d received %v, want %v: the request whole at its first key's owner", i, keys, want)
		}
	}
}

// TestFollowsRingChange: when a node answers that its ring differs, the
// client asks again and routes by the new ring.
func TestFollowsRingChange(t *testing.T) {
	sc := newStaticCluster(t, 3)
	c := sc.routingClient(t, client.WithRingRefresh(time.Hour)) // only a node's word makes it ask again

	smaller := ring.New(sc.members[:2]...)
	sc.ring.Store(smaller)
	learned(t, c, 2)
	sc.received()
	for i := range 30 {
		if ok, err := c.Allow(context.Background(), routed, fmt.Sprint("after:", i)); !ok || err != nil {
			t.Errorf("Allow after:%d = %v, %v", i, ok, err)
		}
	}
	if bad := sc.misrouted(smaller); len(bad) > 0 {
		t.Errorf("after the change, checks sent to a node that does not own them: %v", bad)
	}
}

// TestRoutesAroundAnUnreachableNode: a check whose owner does not answer
// is sent to another node (which, in a real cluster, forwards it), rather
// than fail.
func TestRoutesAroundAnUnreachableNode(t *testing.T) {
	sc := newStaticCluster(t, 3)
	c := sc.routingClient(t)
	sc.servers[2].Stop()

	r := sc.ring.Load()
	checked := 0
	for k := 0; checked < 5; k++ {
		key := fmt.Sprint("down:", k)
		if o, _ := r.Owner(key); o.Name != "node-2" {
			continue
		}
		checked++
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ok, err := c.Allow(ctx, routed, key)
		cancel()
		if !ok || err != nil {
			t.Errorf("Allow %s, owned by the stopped node: %v, %v; want an answer from another node", key, ok, err)
		}
	}
}

func TestOpenRefusesBadSettings(t *testing.T) {
	for _, tc := range []struct {
		name  string
		addrs []string
		opts  []client.Option
		field string
	}{
		{"no address", nil, nil, "addrs: no address given"},
		{"empty address", []string{"127.0.0.1:1", ""}, nil, "addrs[1]: empty address"},
		{"zero refresh", []string{"127.0.0.1:1"}, []client.Option{client.WithCluster(), client.WithRingRefresh(0)}, "ring refresh: must be positive, got 0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := client.Open(tc.addrs, tc.opts...)
			if err == nil || err.Error() != tc.field {
				t.Errorf("Open = %v, %v; want error %q", c, err, tc.field)
			}
		})
	}
}
