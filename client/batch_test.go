package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/api"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/service"
)

const checkMethod = "/ringlimit.v1.RateLimiter/Check"

// serve runs a one-node ringlimit on loopback, with the gRPC options rlnode
// uses, and returns its address.
func serve(t testing.TB) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(api.ServerOptions()...)
	api.New(api.Config{Checker: service.New(service.Config{})}).RegisterGRPC(srv)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// gate records every Check RPC a client sends, and holds the first until
// released, so that a test can gather calls behind it.
type gate struct {
	mu      sync.Mutex
	sent    []*pb.CheckRequest
	entered chan struct{} // closed when the first RPC is held
	release chan struct{}
}

func newGate() *gate { return &gate{entered: make(chan struct{}), release: make(chan struct{})} }

func (g *gate) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if method == checkMethod {
		g.record(proto.CloneOf(req.(*pb.CheckRequest)))
	}
	return invoke(ctx, method, req, reply, cc, opts...)
}

// interceptStream makes g record, and hold, the requests a client sends
// on a CheckStream as it does Check RPCs: they are the same batches.
func (g *gate) interceptStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	return gatedStream{s, g}, err
}

type gatedStream struct {
	grpc.ClientStream
	g *gate
}

func (s gatedStream) SendMsg(m any) error {
	if r, ok := m.(*pb.CheckStreamRequest); ok {
		r = proto.CloneOf(r)
		s.g.record(&pb.CheckRequest{Requests: r.Requests, All: r.All})
	}
	return s.ClientStream.SendMsg(m)
}

// record records req, and holds the first until g is released.
func (g *gate) record(req *pb.CheckRequest) {
	g.mu.Lock()
	g.sent = append(g.sent, req)
	first := len(g.sent) == 1
	g.mu.Unlock()
	if first {
		close(g.entered)
		<-g.release
	}
}

// dialOptions are the options of a client whose batches pass through g,
// whether they travel as Check RPCs or on a CheckStream.
func (g *gate) dialOptions() Option {
	return WithDialOptions(grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(g.intercept), grpc.WithStreamInterceptor(g.interceptStream))
}

// rpcs returns the Check requests sent so far.
func (g *gate) rpcs() []*pb.CheckRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.sent)
}

// gated returns a client of a fresh node whose RPCs pass through g, and
// the node it batches for.
func gated(t *testing.T, g *gate) (*Client, *node) {
	t.Helper()
	c, err := Open([]string{serve(t)}, g.dialOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, c.checker.(*node)
}

// holdFirst sends a request of few checks that the gate holds, and
// returns a channel that yields its error once released. Behind it, a
// node's callers are not few: their checks gather.
func holdFirst(c *Client, g *gate) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := c.Check(context.Background(), firstRequest())
		done <- err
	}()
	<-g.entered
	return done
}

// firstRequest is a request of few checks, of few keys.
func firstRequest() *pb.CheckRequest {
	req := &pb.CheckRequest{}
	for i := range few {
		req.Requests = append(req.Requests, &pb.CheckItem{Name: "first", Key: fmt.Sprint("first", i), Limit: 1, DurationMs: 60_000})
	}
	return req
}

// gathered returns how many parts wait in n's batches.
func (n *node) gathered() int { return n.batch.Gathered() }

// batchingNode returns a node that batches for f, in the current bubble.
func batchingNode(t *testing.T, f *fakeRL) *node {
	n := &node{rl: f, base: t.Context()}
	n.startBatching()
	return n
}

// waitGathered polls until n's queue holds want parts.
func waitGathered(t *testing.T, n *node, want int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); n.gathered() != want; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls gathered within 10s, want %d", n.gathered(), want)
		}
	}
}

func itemsOf(reqs []*pb.CheckRequest) []int {
	var n []int
	for _, r := range reqs {
		n = append(n, len(r.Requests))
	}
	return n
}

// TestConcurrentChecksShareAnRPC: checks that arrive while an RPC is in
// flight to the node go together in the next, and each caller gets the
// answer to its own check.
func TestConcurrentChecksShareAnRPC(t *testing.T) {
	g := newGate()
	c, n := gated(t, g)
	first := holdFirst(c, g)

	const callers = sendAt - 1 // sendAt would go without waiting
	got := make([]Decision, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		// Each caller's limit is its own, so that a mixed-up answer shows.
		wg.Go(func() {
			got[i], errs[i] = c.Take(context.Background(), Limit{Name: "own", Count: int64(i + 2), Period: time.Minute}, fmt.Sprint("user:", i), 1)
		})
	}
	waitGathered(t, n, callers)
	close(g.release)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i := range callers {
		if errs[i] != nil || !got[i].Allowed || got[i].Limit != int64(i+2) || got[i].Remaining != int64(i+1) {
			t.Errorf("caller %d: %+v, %v; want its own limit %d with %d remaining", i, got[i], errs[i], i+2, i+1)
		}
	}
	if rpcs := itemsOf(g.rpcs()); !slices.Equal(rpcs, []int{few, callers}) {
		t.Errorf("RPCs of %v items, want the first and then the %d gathered in one", rpcs, callers)
	}
}

// TestIdleChecksGoAtOnce: a check that finds nothing in flight goes at
// once, in an RPC of its own.
func TestIdleChecksGoAtOnce(t *testing.T) {
	g := newGate()
	close(g.release)
	c, _ := gated(t, g)
	for i := range 5 {
		if ok, err := c.Allow(context.Background(), Limit{Name: "idle", Count: 10, Period: time.Minute}, "k"); !ok || err != nil {
			t.Fatalf("Allow #%d = %v, %v", i+1, ok, err)
		}
	}
	if rpcs := itemsOf(g.rpcs()); !slices.Equal(rpcs, []int{1, 1, 1, 1, 1}) {
		t.Errorf("5 checks one after another went in RPCs of %v items, want 5 of 1", rpcs)
	}
}

// fakeRL is a node that answers every item as admitted, from the
// bubble of a synctest: it holds each RPC until hold yields, if hold is
// not nil, and counts RPCs.
type fakeRL struct {
	hold chan struct{}
	mu   sync.Mutex
	rpcs []int // items of each RPC
}

func (f *fakeRL) Check(_ context.Context, req *pb.CheckRequest, _ ...grpc.CallOption) (*pb.CheckResponse, error) {
	f.mu.Lock()
	f.rpcs = append(f.rpcs, len(req.Requests))
	f.mu.Unlock()
	if f.hold != nil {
		<-f.hold
	}
	resp := &pb.CheckResponse{}
	for _, it := range req.Requests {
		resp.Responses = append(resp.Responses, &pb.CheckResult{Limit: it.Limit})
	}
	return resp, nil
}

func (f *fakeRL) Members(context.Context, *pb.MembersRequest, ...grpc.CallOption) (*pb.MembersResponse, error) {
	return &pb.MembersResponse{}, nil
}

func (f *fakeRL) CheckStream(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[pb.CheckStreamRequest, pb.CheckStreamResponse], error) {
	return nil, errors.New("fakeRL serves no stream") // unused: the node of TestBatchingAddsNoDelay has none
}

func (f *fakeRL) Lease(context.Context, *pb.LeaseRequest, ...grpc.CallOption) (*pb.LeaseResponse, error) {
	return nil, errors.New("fakeRL takes no lease") // unused: the checks of these tests are not leased
}

func (f *fakeRL) Settle(context.Context, *pb.SettleRequest, ...grpc.CallOption) (*pb.SettleResponse, error) {
	return nil, errors.New("fakeRL holds no reservation") // unused: the checks of these tests reserve nothing
}

// TestBatchingAddsNoDelay runs the batching in virtual time: an idle
// check is answered without time passing, and a check gathered behind
// another goes as soon as that one returns, without time passing either.
func TestBatchingAddsNoDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRL{}
		n := batchingNode(t, f)
		req := func(limit int64) *pb.CheckRequest {
			return &pb.CheckRequest{Requests: []*pb.CheckItem{{Name: "a", Key: "k", Limit: limit, DurationMs: 1000}}}
		}
		start := time.Now()
		if _, err := n.Check(t.Context(), req(1)); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("an idle check took %v of virtual time, want 0", d)
		}

		f.hold = make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			if _, err := n.Check(t.Context(), firstRequest()); err != nil {
				t.Error(err)
			}
		})
		synctest.Wait() // few checks in flight: callers that come now are not few
		for i := range 2 {
			wg.Go(func() {
				resp, err := n.Check(t.Context(), req(int64(i+1)))
				if err != nil || resp.Responses[0].Limit != int64(i+1) {
					t.Errorf("check %d: %v, %v", i, resp, err)
				}
			})
			synctest.Wait()
		}
		if got := n.gathered(); got != 2 {
			t.Errorf("%d checks gathered behind the few in flight, want 2", got)
		}
		f.hold <- struct{}{} // the first returns; the gathered two go at once
		synctest.Wait()
		f.hold <- struct{}{}
		wg.Wait()
		if d := time.Since(start); d != 0 {
			t.Errorf("gathered checks took %v of virtual time, want 0", d)
		}
		if want := []int{1, few, 2}; !slices.Equal(f.rpcs, want) {
			t.Errorf("RPCs of %v items, want %v", f.rpcs, want)
		}
	})
}

// TestFewCallersDoNotWait runs in virtual time, with every RPC held until
// released: while the checks in flight and gathered are fewer than few,
// each caller's check goes at once, in a batch of its own, up to
// maxFlying batches in flight; the next caller's gathers.
func TestFewCallersDoNotWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRL{hold: make(chan struct{})}
		n := batchingNode(t, f)
		var wg sync.WaitGroup
		const callers = few // the last is one too many
		for range callers {
			wg.Go(func() {
				if _, err := n.Check(t.Context(), &pb.CheckRequest{Requests: []*pb.CheckItem{{Name: "a", Key: "k", Limit: 1, DurationMs: 1000}}}); err != nil {
					t.Error(err)
				}
			})
			synctest.Wait()
		}
		if want := []int{1, 1, 1, 1}; !slices.Equal(f.rpcs, want) {
			t.Errorf("RPCs of %v items while %d callers waited, want %v: each at once, up to maxFlying", f.rpcs, callers, want)
		}
		if got := n.gathered(); got != callers-maxFlying {
			t.Errorf("%d checks gathered with %d batches in flight, want %d", got, maxFlying, callers-maxFlying)
		}
		for range maxFlying + 1 { // the gathered ones go together when the first returns
			f.hold <- struct{}{}
			synctest.Wait()
		}
		wg.Wait()
		if want := []int{1, 1, 1, 1, callers - maxFlying}; !slices.Equal(f.rpcs, want) {
			t.Errorf("RPCs of %v items, want %v", f.rpcs, want)
		}
	})
}

// TestFullEnoughBatchGoesWithoutWaiting runs in virtual time, with every
// RPC held until released: behind few checks in flight, a gathered batch
// that reaches sendAt checks goes at once, while others are in flight,
// until maxFlying are; checks that arrive then gather, beyond sendAt, and
// go when one returns.
func TestFullEnoughBatchGoesWithoutWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRL{hold: make(chan struct{})}
		n := batchingNode(t, f)
		item := []*pb.CheckItem{{Name: "a", Key: "k", Limit: 1, DurationMs: 1000}}
		var wg sync.WaitGroup
		check := func() {
			wg.Go(func() {
				if _, err := n.Check(t.Context(), &pb.CheckRequest{Requests: item}); err != nil {
					t.Error(err)
				}
			})
			synctest.Wait()
		}
		wg.Go(func() {
			if _, err := n.Check(t.Context(), firstRequest()); err != nil {
				t.Error(err)
			}
		})
		synctest.Wait() // in flight: callers that come now are not few
		for range (maxFlying - 1) * sendAt {
			check()
		}
		const late = sendAt + 5 // more than sendAt: nothing more may go
		for range late {
			check()
		}
		if want := []int{few, sendAt, sendAt, sendAt}; !slices.Equal(f.rpcs, want) {
			t.Errorf("RPCs of %v items while %d were held, want %v", f.rpcs, maxFlying, want)
		}
		if got := n.gathered(); got != late {
			t.Errorf("%d checks gathered with %d batches in flight, want %d", got, maxFlying, late)
		}
		for range maxFlying + 1 { // the gathered batch goes when the first returns
			f.hold <- struct{}{}
			synctest.Wait()
		}
		wg.Wait()
		if want := []int{few, sendAt, sendAt, sendAt, late}; !slices.Equal(f.rpcs, want) {
			t.Errorf("RPCs of %v items, want %v", f.rpcs, want)
		}
	})
}

// TestAllGroupsTravelAsSent: a request whose "all" groups items (two
// share a key) goes alone and whole, so its group is decided together; one
// with "all" and distinct keys, which groups nothing, shares the batch.
func TestAllGroupsTravelAsSent(t *testing.T) {
	g := newGate()
	c, n := gated(t, g)
	first := holdFirst(c, g)

	group := &pb.CheckRequest{All: true, Requests: []*pb.CheckItem{
		{Name: "minute", Key: "g", Limit: 10, DurationMs: 60_000},
		{Name: "second", Key: "g", Limit: 1, DurationMs: 1000, Hits: proto.Int64(2)}, // never admitted: nor is the minute
	}}
	resp, err := c.Check(context.Background(), group)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range resp.Responses {
		if r.Status != pb.Status_OVER_LIMIT {
			t.Errorf("grouped item %d: %v, want refused with its group", i, r)
		}
	}

	var wg sync.WaitGroup
	distinct := &pb.CheckRequest{All: true, Requests: []*pb.CheckItem{
		{Name: "d", Key: "d1", Limit: 1, DurationMs: 60_000}, {Name: "d", Key: "d2", Limit: 1, DurationMs: 60_000}}}
	wg.Go(func() {
		if resp, err := c.Check(context.Background(), distinct); err != nil || len(resp.Responses) != 2 {
			t.Errorf("distinct keys: %v, %v", resp, err)
		}
	})
	wg.Go(func() {
		if ok, err := c.Allow(context.Background(), Limit{Name: "p", Count: 1, Period: time.Minute}, "g"); !ok || err != nil {
			t.Errorf("plain check of the group's key: %v, %v", ok, err)
		}
	})
	waitGathered(t, n, 2)
	close(g.release)
	wg.Wait()
	<-first

	rpcs := g.rpcs()
	if len(rpcs) != 3 || !proto.Equal(rpcs[1], group) || rpcs[2].All || len(rpcs[2].Requests) != 3 {
		t.Errorf("RPCs %v\nwant the first, the group alone as sent, then one of 3 items without all", rpcs)
	}
	d, err := c.Take(context.Background(), Limit{Name: "minute", Count: 10, Period: time.Minute}, "g", 0)
	if err != nil || d.Remaining != 10 {
		t.Errorf("the group's minute counter: %+v, %v; want 10 remaining: a refused group charges none", d, err)
	}
}

// TestGoneCallerIsChargedNothing: a caller whose context ends while its
// check is gathered is dropped from the batch and charged nothing; the
// others in the batch are answered.
func TestGoneCallerIsChargedNothing(t *testing.T) {
	g := newGate()
	c, n := gated(t, g)
	first := holdFirst(c, g)
	l := Limit{Name: "gone", Count: 5, Period: time.Minute}

	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		_, err := c.Allow(ctx, l, "leaves")
		gone <- err
	}()
	stays := make(chan error, 1)
	go func() {
		_, err := c.Allow(context.Background(), l, "stays")
		stays <- err
	}()
	waitGathered(t, n, 2)
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Errorf("the gone caller's Allow: %v, want context.Canceled", err)
	}
	close(g.release)
	if err := <-stays; err != nil {
		t.Error(err)
	}
	<-first
	if rpcs := g.rpcs(); len(rpcs) != 2 || len(rpcs[1].Requests) != 1 || rpcs[1].Requests[0].Key != "stays" {
		t.Errorf("RPCs %v, want the first and then the staying caller's check alone", rpcs)
	}
	for key, want := range map[string]int64{"leaves": 5, "stays": 4} {
		if d, err := c.Take(context.Background(), l, key, 0); err != nil || d.Remaining != want {
			t.Errorf("%s: %+v, %v; want %d remaining", key, d, err, want)
		}
	}
}

// wrongCount is a node that answers every request with one result too
// few.
type wrongCount struct {
	pb.UnimplementedRateLimiterServer
}

func (wrongCount) Check(_ context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	return &pb.CheckResponse{Responses: make([]*pb.CheckResult, len(req.Requests)-1)}, nil
}

// TestBatchOfWrongLengthFails: an answer whose results do not match the
// batch's items is an error for every caller in it, never a shifted
// answer.
func TestBatchOfWrongLengthFails(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterRateLimiterServer(srv, wrongCount{})
	go srv.Serve(lis)
	defer srv.Stop()
	g := newGate()
	c, err := Open([]string{lis.Addr().String()}, g.dialOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	first := holdFirst(c, g)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			if _, err := c.Allow(context.Background(), Limit{Name: "w", Count: 1, Period: time.Second}, fmt.Sprint(i)); !errors.Is(err, ErrInternal) {
				t.Errorf("caller %d: %v, want ErrInternal", i, err)
			}
		})
	}
	waitGathered(t, c.checker.(*node), 2)
	close(g.release)
	wg.Wait()
	<-first
}

// crowd is a node that claims a ring of more members than a client
// believes, and answers checks as a one-node service.
type crowd struct {
	pb.UnimplementedRateLimiterServer
	svc *service.Service
}

func (c crowd) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	return c.svc.Check(ctx, req)
}

func (crowd) Members(context.Context, *pb.MembersRequest) (*pb.MembersResponse, error) {
	resp := &pb.MembersResponse{Ring: 1}
	for i := range maxMembers + 1 {
		resp.Members = append(resp.Members, &pb.Member{Name: fmt.Sprint("n", i), GrpcAddr: fmt.Sprintf("127.0.0.1:%d", 10000+i)})
	}
	return resp, nil
}

// TestTooManyMembersAreNotBelieved: a ring of more than maxMembers is not
// built (it would take long and much memory): the client keeps sending to
// the address it was given.
func TestTooManyMembersAreNotBelieved(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterRateLimiterServer(srv, crowd{svc: service.New(service.Config{})})
	go srv.Serve(lis)
	defer srv.Stop()
	c, err := Open([]string{lis.Addr().String()}, WithCluster())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ok, err := c.Allow(context.Background(), Limit{Name: "c", Count: 1, Period: time.Minute}, "k"); !ok || err != nil {
		t.Fatalf("Allow = %v, %v", ok, err)
	}
	c.router.wg.Wait() // the refresh the first check started
	if c.router.lastTry.Load() == 0 || c.Ring() != nil {
		t.Errorf("after a refresh (started: %v), the client routes by %v, want no ring", c.router.lastTry.Load() != 0, c.Ring())
	}
}

// TestItemBytesBoundsTheEncoding: itemBytes, which bounds a batch's bytes
// (under the node's receive limit) and a stream's unanswered bytes (under
// gRPC's write quota), is at least an item's encoded size in a request,
// with every field at its widest, a parent's key and fields unknown.
func TestItemBytesBoundsTheEncoding(t *testing.T) {
	widest := int64(-1) // ten bytes as a varint
	it := &pb.CheckItem{
		Name: "name", Key: "key", Hits: &widest, Limit: widest, DurationMs: widest, Algorithm: pb.Algorithm(-1),
		Burst: widest, Behavior: pb.Behavior(-1), Reset_: true, CreatedAtMs: widest, ChargeRefused: true,
		Policy: "domain/k=v", MinIntervalMs: widest, Ceiling: widest, ReserveTtlMs: &widest,
		Parent: &pb.ParentLimit{Key: strings.Repeat("p", 300), Limit: widest, DurationMs: widest},
	}
	it.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 99, protowire.BytesType), make([]byte, 200)))
	it.Parent.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 99, protowire.BytesType), make([]byte, 100)))
	n := proto.Size(it)
	inRequest := 1 + protowire.SizeVarint(uint64(n)) + n
	if got := itemBytes(it); got < inRequest {
		t.Errorf("itemBytes = %d, under the %d bytes the item takes in a request", got, inRequest)
	}
	req := &pb.CheckStreamRequest{Requests: []*pb.CheckItem{it, it}, All: true, Id: math.MaxUint64, TimeoutMs: widest, Ring: math.MaxUint64}
	if got, want := streamBytes(req), proto.Size(req); got < want {
		t.Errorf("streamBytes = %d, under the request's %d bytes", got, want)
	}
}
