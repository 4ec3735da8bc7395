package peer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/peerpb"
)

// fakeHandler echoes forwarded requests (see echo) and counts calls. If
// block is non-nil, Forwarded waits for it or for the RPC's end.
type fakeHandler struct {
	block    chan struct{}
	entered  chan struct{} // if non-nil, gets a value each time Forwarded starts
	forwards atomic.Int64
	relays   atomic.Int64                                 // of forwards: those relayed
	answer   func([]*pb.CheckRequest) []*pb.CheckResponse // nil means echo
	refusals []*peerpb.Refusal                            // if non-nil, HandOff's answer

	mu         sync.Mutex
	hits       []*peerpb.GlobalReport
	reportedBy string
	states     []*peerpb.GlobalState
	updatedBy  string
	handedBy   string
	replicaOf  string   // sender of the last Replicate
	done       []string // "from:ring" of each HandOffDone, in order
	left       []string // "from:ring" of each Left, in order
	leftErr    error    // Left's answer
	stranger   string   // if set, AddGlobalHits and UpdateGlobals refuse it
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

func (h *fakeHandler) Relayed(ctx context.Context, reqs []*pb.CheckRequest) []*pb.CheckResponse {
	h.relays.Add(1)
	return h.Forwarded(ctx, reqs)
}

// Pulled holds no counter but for keys named "held".
func (h *fakeHandler) Pulled(ctx context.Context, reqs []*pb.CheckRequest) ([]*pb.CheckResponse, error) {
	for _, r := range reqs {
		for _, it := range r.GetRequests() {
			if it.GetKey() != "held" {
				return nil, ErrNotHere
			}
		}
	}
	return h.Forwarded(ctx, reqs), nil
}

func (h *fakeHandler) AddGlobalHits(_ context.Context, from string, reports []*peerpb.GlobalReport) error {
	if from == h.stranger {
		return errors.New("a stranger")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hits = append(h.hits, reports...)
	h.reportedBy = from
	return nil
}

func (h *fakeHandler) UpdateGlobals(_ context.Context, from string, states []*peerpb.GlobalState) error {
	if from == h.stranger {
		return errors.New("a stranger")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.states = append(h.states, states...)
	h.updatedBy = from
	return nil
}

// HandOff refuses, as INVALID, every counter with an empty record, unless
// refusals says what to answer.
func (h *fakeHandler) HandOff(_ context.Context, from string, counters []*peerpb.CounterState) []*peerpb.Refusal {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.handedBy = from
	if h.refusals != nil {
		return h.refusals
	}
	return emptyRefused(counters)
}

// emptyRefused refuses, as INVALID, every counter with an empty record.
func emptyRefused(counters []*peerpb.CounterState) []*peerpb.Refusal {
	var refused []*peerpb.Refusal
	for i, c := range counters {
		if len(c.GetCounter()) == 0 {
			refused = append(refused, &peerpb.Refusal{Index: int32(i), Reason: peerpb.Refusal_INVALID, Detail: "empty"})
		}
	}
	return refused
}

// Replicate refuses counters as HandOff does.
func (h *fakeHandler) Replicate(_ context.Context, from string, counters []*peerpb.CounterState) []*peerpb.Refusal {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.replicaOf = from
	return emptyRefused(counters)
}

func (h *fakeHandler) HandOffDone(_ context.Context, from string, ring uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.done = append(h.done, fmt.Sprintf("%s:%d", from, ring))
}

func (h *fakeHandler) Left(_ context.Context, from string, ring uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.left = append(h.left, fmt.Sprintf("%s:%d", from, ring))
	return h.leftErr
}

// serve starts a Peer server for h on a loopback port and returns its
// address. The server stops at the test's cleanup.
func serve(t testing.TB, h Handler) string {
	t.Helper()
	return serveService(t, NewServer(h, nil))
}

// serveService is serve for any implementation of the Peer service, such
// as one that breaks the protocol, with the server options opts.
func serveService(t testing.TB, srv peerpb.PeerServer, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveListener(t, lis, srv, opts...)
}

// serveListener is serveService on lis.
func serveListener(t testing.TB, lis net.Listener, srv peerpb.PeerServer, opts ...grpc.ServerOption) string {
	t.Helper()
	g := grpc.NewServer(append(ServerOptions(), opts...)...)
	if s, ok := srv.(*Server); ok {
		s.Register(g) // as a node registers it: under both names
	} else {
		peerpb.RegisterPeerServer(g, srv)
	}
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

// requests returns n requests of items items each.
func requests(n, items int) []*pb.CheckRequest {
	reqs := make([]*pb.CheckRequest, n)
	for i := range reqs {
		reqs[i] = check(fmt.Sprint("k", i), items)
	}
	return reqs
}

// TestServerForwardBounds sends forwards over real gRPC: one request may
// carry the public API's item bound and no more (the attack: a forward of
// 10x it), a batch MaxForwardItems in all. A refused forward never
// reaches the handler, and is counted.
func TestServerForwardBounds(t *testing.T) {
	tests := []struct {
		name   string
		reqs   []*pb.CheckRequest
		answer func([]*pb.CheckRequest) []*pb.CheckResponse
		want   codes.Code
		reason string // of a refusal, as counted
	}{
		{name: "ok", reqs: []*pb.CheckRequest{check("a", 2), check("b", 1)}, want: codes.OK},
		{name: "empty", reqs: nil, want: codes.OK},
		{name: "at the item limit", reqs: requests(MaxForwardItems/checks.MaxItems, checks.MaxItems), want: codes.OK},
		{name: "10x the public bound in one request", reqs: requests(1, 10*checks.MaxItems), want: codes.InvalidArgument, reason: "too_many_items"},
		{name: "one item over the public bound", reqs: requests(1, checks.MaxItems+1), want: codes.InvalidArgument, reason: "too_many_items"},
		{name: "too many requests", reqs: requests(MaxForwardItems+1, 0), want: codes.InvalidArgument, reason: "too_many_requests"},
		{name: "too many items", reqs: requests(MaxForwardItems/checks.MaxItems+1, checks.MaxItems), want: codes.InvalidArgument, reason: "too_many_items"},
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
			reg := prometheus.NewRegistry()
			client := dial(t, serveService(t, NewServer(h, reg)))
			resp, err := client.Forward(t.Context(), &peerpb.ForwardRequest{Requests: tt.reqs})
			if got := status.Code(err); got != tt.want {
				t.Fatalf("code = %v (%v), want %v", got, err, tt.want)
			}
			if tt.reason != "" {
				if h.forwards.Load() != 0 {
					t.Error("handler called for a refused batch")
				}
				if got := refusedRPCs(t, reg, "forward", tt.reason); got != 1 {
					t.Errorf("refused forwards counted %v, want 1", got)
				}
			}
			if err == nil && len(resp.GetResponses()) != len(tt.reqs) {
				t.Fatalf("%d responses for %d requests", len(resp.GetResponses()), len(tt.reqs))
			}
		})
	}
}

// TestServerRefusesBadSenders: GLOBAL reports, GLOBAL states, hand-offs,
// replicas, lease relays and settlements name their sender; a name no node can have is refused with
// InvalidArgument, one the handler does not know as a member with
// PermissionDenied, in both cases before the handler takes anything.
func TestServerRefusesBadSenders(t *testing.T) {
	h := &fakeHandler{stranger: "mallory"}
	reg := prometheus.NewRegistry()
	client := dial(t, serveService(t, NewServer(h, reg)))
	reports := []*peerpb.GlobalReport{{Item: &pb.CheckItem{Name: "n", Key: "k"}, Admitted: 1_000_000_000}}
	states := []*peerpb.GlobalState{{Name: "n", Key: "k", Remaining: 1_000_000_000}}
	calls := map[string]func(from string) error{
		"global_report": func(from string) error {
			_, err := client.AddGlobalHits(t.Context(), &peerpb.GlobalHitsRequest{From: from, Reports: reports})
			return err
		},
		"global_state": func(from string) error {
			_, err := client.UpdateGlobals(t.Context(), &peerpb.GlobalUpdateRequest{From: from, States: states})
			return err
		},
		"handoff": func(from string) error {
			_, err := client.HandOff(t.Context(), &peerpb.HandOffRequest{From: from, Counters: []*peerpb.CounterState{{Counter: []byte{1}}}})
			return err
		},
		"replicate": func(from string) error {
			_, err := client.Replicate(t.Context(), &peerpb.ReplicateRequest{From: from, Counters: []*peerpb.CounterState{{Counter: []byte{1}}}})
			return err
		},
		"lease": func(from string) error {
			_, err := client.Lease(t.Context(), &peerpb.LeaseRelayRequest{From: from, Lessee: make([]byte, 16)})
			return err
		},
		"settle": func(from string) error {
			_, err := client.Settle(t.Context(), &peerpb.SettleRelayRequest{From: from})
			return err
		},
	}
	// Only GLOBAL reports and states ask the handler whether their sender
	// is a member; the other calls leave membership to the Guard.
	asksHandler := map[string]bool{"global_report": true, "global_state": true}
	for rpc, call := range calls {
		for _, tt := range []struct {
			from   string
			want   codes.Code
			reason string
		}{
			{"", codes.InvalidArgument, "bad_sender"},
			{"node\x00-1", codes.InvalidArgument, "bad_sender"},
			{strings.Repeat("n", peerpb.MaxNodeNameLen+1), codes.InvalidArgument, "bad_sender"},
			{"mallory", codes.PermissionDenied, "unknown_sender"},
		} {
			if !asksHandler[rpc] && tt.from == "mallory" {
				continue // membership is the Guard's
			}
			if got := status.Code(call(tt.from)); got != tt.want {
				t.Errorf("%s from %.20q: code %v, want %v", rpc, tt.from, got, tt.want)
			}
		}
		if got := refusedRPCs(t, reg, rpc, "bad_sender"); got != 3 {
			t.Errorf("%s refused as bad_sender %v times, want 3", rpc, got)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.hits) != 0 || len(h.states) != 0 || h.handedBy != "" || h.replicaOf != "" {
		t.Errorf("the handler took hits %v, states %v, a hand-off from %q, replicas from %q; want nothing", h.hits, h.states, h.handedBy, h.replicaOf)
	}
	if got := refusedRPCs(t, reg, "global_report", "unknown_sender") + refusedRPCs(t, reg, "global_state", "unknown_sender"); got != 2 {
		t.Errorf("refused as unknown_sender %v times, want 2", got)
	}
}

// TestServerHandOffBounds: a hand-off of more counters than a batch holds
// is refused whole, before the handler sees it.
func TestServerHandOffBounds(t *testing.T) {
	h := &fakeHandler{}
	client := dial(t, serve(t, h))
	counters := make([]*peerpb.CounterState, peerpb.MaxHandOffCounters+1)
	for i := range counters {
		counters[i] = &peerpb.CounterState{Counter: []byte{1}}
	}
	_, err := client.HandOff(t.Context(), &peerpb.HandOffRequest{From: "a", Counters: counters})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("HandOff of %d counters: %v, want InvalidArgument", len(counters), err)
	}
	_, err = client.Replicate(t.Context(), &peerpb.ReplicateRequest{From: "a", Counters: counters})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Replicate of %d counters: %v, want InvalidArgument", len(counters), err)
	}
	if h.handedBy != "" || h.replicaOf != "" {
		t.Error("the handler saw a refused hand-off or replication")
	}
}

// TestServerReceiveLimit: the peer server refuses a message over
// MaxMessageBytes with ResourceExhausted, and the Pool refuses to send
// one, so a sender learns to split it.
func TestServerReceiveLimit(t *testing.T) {
	h := &fakeHandler{}
	addr := serve(t, h)
	big := []*peerpb.CounterState{{Counter: make([]byte, MaxMessageBytes)}}
	_, err := dial(t, addr).HandOff(t.Context(), &peerpb.HandOffRequest{From: "a", Counters: big}, grpc.MaxCallSendMsgSize(2*MaxMessageBytes))
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("server took a message over MaxMessageBytes: %v, want ResourceExhausted", err)
	}
	p := NewPool(Config{})
	defer p.Close()
	if _, err := p.HandOff(t.Context(), addr, "a", big); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("Pool sent a message over MaxMessageBytes: %v, want ResourceExhausted", err)
	}
	if h.handedBy != "" {
		t.Error("the handler saw an oversized hand-off")
	}
}

// dial returns a raw Peer client to addr, as an attacker (or a peer) would
// have; it is closed at the test's cleanup.
func dial(t *testing.T, addr string) peerpb.PeerClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return peerpb.NewPeerClient(cc)
}

// refusedRPCs reads ringlimit_peer_refused_rpcs_total{rpc,reason}.
func refusedRPCs(t *testing.T, reg *prometheus.Registry, rpc, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ringlimit_peer_refused_rpcs_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["rpc"] == rpc && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestServerHandOffRefusals: the response counts what the handler did not
// refuse, and a handler that refuses counters it was not given is a bug
// the server reports rather than passes on.
func TestServerHandOffRefusals(t *testing.T) {
	two := []*peerpb.CounterState{{Counter: []byte{1}}, {Counter: []byte{1}}}
	for _, tt := range []struct {
		name     string
		refusals []*peerpb.Refusal
		want     codes.Code
		accepted int64
	}{
		{"none refused", []*peerpb.Refusal{}, codes.OK, 2},
		{"one refused", []*peerpb.Refusal{{Index: 1, Reason: peerpb.Refusal_UNKNOWN_VERSION}}, codes.OK, 1},
		{"index out of range", []*peerpb.Refusal{{Index: 2}}, codes.Internal, 0},
		{"negative index", []*peerpb.Refusal{{Index: -1}}, codes.Internal, 0},
		{"refused twice", []*peerpb.Refusal{{Index: 0}, {Index: 0}}, codes.Internal, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := &fakeHandler{refusals: tt.refusals}
			resp, err := NewServer(h, nil).HandOff(t.Context(), &peerpb.HandOffRequest{From: "a", Counters: two})
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
	peerpb.UnimplementedPeerServer
	resp *peerpb.HandOffResponse
}

func (h handOffAnswer) HandOff(context.Context, *peerpb.HandOffRequest) (*peerpb.HandOffResponse, error) {
	return h.resp, nil
}

// TestPoolHandOffChecksTheAnswer: an answer that does not say which
// counters were taken is an error, so the sender keeps them all rather
// than guess.
func TestPoolHandOffChecksTheAnswer(t *testing.T) {
	two := []*peerpb.CounterState{{Counter: []byte{1}}, {Counter: []byte{2}}}
	for _, tt := range []struct {
		name string
		resp *peerpb.HandOffResponse
		ok   bool
	}{
		{"all taken", &peerpb.HandOffResponse{Accepted: 2}, true},
		{"one refused", &peerpb.HandOffResponse{Accepted: 1, Refused: []*peerpb.Refusal{{Index: 0}}}, true},
		{"accepted disagrees", &peerpb.HandOffResponse{Accepted: 2, Refused: []*peerpb.Refusal{{Index: 0}}}, false},
		{"refusal out of range", &peerpb.HandOffResponse{Accepted: 1, Refused: []*peerpb.Refusal{{Index: 5}}}, false},
		{"refused twice", &peerpb.HandOffResponse{Accepted: 0, Refused: []*peerpb.Refusal{{Index: 1}, {Index: 1}}}, false},
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
