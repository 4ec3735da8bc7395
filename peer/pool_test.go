package peer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
)

// startPool returns a Pool whose Run runs until stop or the test's cleanup,
// which also closes the Pool. stop cancels Run and returns its error.
func startPool(t testing.TB, conf Config) (p *Pool, stop func() error) {
	t.Helper()
	p = NewPool(conf)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			runErr = <-done
		})
		return runErr
	}
	t.Cleanup(func() {
		_ = stop()
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p, stop
}

// forwardAll makes n concurrent Forward calls, caller i with key "k<i>", and
// returns the first error, including a caller getting another's answer.
func forwardAll(ctx context.Context, p *Pool, addr string, n int) error {
	errs := make(chan error, n)
	for i := range n {
		go func() {
			key := fmt.Sprint("k", i)
			resp, err := p.Forward(ctx, addr, check(key, 1))
			if err == nil && keyOf(resp) != key {
				err = fmt.Errorf("caller %s got the answer for %s", key, keyOf(resp))
			}
			errs <- err
		}()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// TestForwardBatches: calls that arrive while a batch is in flight share
// RPCs over real gRPC. The first call goes at once and blocks in the
// handler; the next 75, with BatchLimit 25 and a BatchWait of an hour, can
// only leave in full batches while it is in flight, so the RPCs are exact
// however the machine schedules the callers. How batches are timed is
// checked in virtual time by TestBatcherTimeline.
func TestForwardBatches(t *testing.T) {
	var mu sync.Mutex
	var sizes []int // requests per RPC, in arrival order
	h := &fakeHandler{
		block:   make(chan struct{}),
		entered: make(chan struct{}, maxInFlight),
		answer: func(reqs []*pb.CheckRequest) []*pb.CheckResponse {
			mu.Lock()
			sizes = append(sizes, len(reqs))
			mu.Unlock()
			return echo(reqs)
		},
	}
	addr := serve(t, h)
	p, _ := startPool(t, Config{BatchWait: time.Hour, BatchLimit: 25, Timeout: time.Minute})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	first := make(chan error, 1)
	go func() {
		_, err := p.Forward(ctx, addr, check("first", 1))
		first <- err
	}()
	<-h.entered
	rest := make(chan error, 1)
	go func() { rest <- forwardAll(ctx, p, addr, 75) }()
	for range 3 {
		<-h.entered
	}
	close(h.block)
	if err := cmp.Or(<-first, <-rest); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(sizes)
	if !slices.Equal(sizes, []int{1, 25, 25, 25}) {
		t.Errorf("requests per RPC = %v, want the first alone, then 3 full batches [1 25 25 25]", sizes)
	}
}

// TestForwardLoneRequestGoesAtOnce: with nothing in flight a call does not
// wait for company, so it is answered well within Timeout even though
// BatchWait is an hour.
func TestForwardLoneRequestGoesAtOnce(t *testing.T) {
	h := &fakeHandler{}
	addr := serve(t, h)
	p, _ := startPool(t, Config{BatchWait: time.Hour, Timeout: 5 * time.Second})
	resp, err := p.Forward(t.Context(), addr, check("lone", 1))
	if err != nil {
		t.Fatal(err)
	}
	if keyOf(resp) != "lone" {
		t.Errorf("got the answer for %q, want lone", keyOf(resp))
	}
}

// closedAddr returns a loopback address that nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

func TestUnreachable(t *testing.T) {
	const timeout = 500 * time.Millisecond
	addr := closedAddr(t)
	p, _ := startPool(t, Config{Timeout: timeout})
	calls := map[string]func(ctx context.Context) error{
		"Forward": func(ctx context.Context) error {
			_, err := p.Forward(ctx, addr, check("a", 1))
			return err
		},
		"ForwardNow": func(ctx context.Context) error {
			_, err := p.ForwardNow(ctx, addr, check("a", 1))
			return err
		},
		"AddGlobalHits": func(ctx context.Context) error { return p.AddGlobalHits(ctx, addr, "me", nil) },
		"UpdateGlobals": func(ctx context.Context) error { return p.UpdateGlobals(ctx, addr, "me", nil) },
		"HandOff": func(ctx context.Context) error {
			_, err := p.HandOff(ctx, addr, "me", nil)
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			err := call(t.Context())
			if !errors.Is(err, ErrUnreachable) {
				t.Errorf("err = %v, want ErrUnreachable", err)
			}
			if d := time.Since(start); d > timeout+time.Second {
				t.Errorf("took %v, want about %v at most", d, timeout)
			}
		})
	}
}

func TestForwardCallerCancels(t *testing.T) {
	h := &fakeHandler{block: make(chan struct{})} // the call is in flight when its caller leaves
	addr := serve(t, h)
	p, _ := startPool(t, Config{BatchWait: time.Hour, Timeout: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(10*time.Millisecond, cancel)
	start := time.Now()
	_, err := p.Forward(ctx, addr, check("a", 1))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("returned %v after the call, want promptly after cancel", d)
	}
}

func TestShutdown(t *testing.T) {
	h := &fakeHandler{block: make(chan struct{}), entered: make(chan struct{}, 3)}
	addr := serve(t, h)
	ignoreServer := goleak.IgnoreCurrent() // the server's goroutines stop at cleanup
	p, stop := startPool(t, Config{BatchWait: time.Hour, BatchLimit: 2, Timeout: time.Hour})

	// The first call goes at once and blocks in the handler; the other two
	// gather behind it, fill a batch and follow it, or are still on their
	// way in when Run stops. Either way, all three fail with ErrClosed.
	errs := make(chan error, 3)
	for i := range 3 {
		go func() {
			_, err := p.Forward(t.Context(), addr, check(fmt.Sprint(i), 1))
			errs <- err
		}()
	}
	<-h.entered
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v, want context.Canceled", err)
	}
	for range 3 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("in-flight caller got %v, want ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("caller still waiting 5s after Run returned")
		}
	}
	if _, err := p.Forward(t.Context(), addr, check("late", 1)); !errors.Is(err, ErrClosed) {
		t.Errorf("Forward after Run: %v, want ErrClosed", err)
	}
	// Unary calls work until Close, e.g. to hand off while shutting down.
	if refused, err := p.HandOff(t.Context(), addr, "me", []*peerpb.CounterState{{Counter: []byte{1}}}); err != nil || len(refused) != 0 {
		t.Errorf("HandOff after Run = %v, %v; want no refusals, nil", refused, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ForwardNow(t.Context(), addr, check("late", 1)); !errors.Is(err, ErrClosed) {
		t.Errorf("ForwardNow after Close: %v, want ErrClosed", err)
	}
	// Nothing of Run's, nor of the connections', is left.
	goleak.VerifyNone(t, ignoreServer)
}

func TestRunTwice(t *testing.T) {
	p := NewPool(Config{})
	defer p.Close()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := p.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want context.Canceled", err)
	}
	if err := p.Run(t.Context()); err == nil {
		t.Error("second Run returned nil, want an error")
	}
}

func TestRetain(t *testing.T) {
	h := &fakeHandler{}
	a, b := serve(t, h), serve(t, h)
	const timeout = 100 * time.Millisecond
	p, _ := startPool(t, Config{Timeout: timeout})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, addr := range []string{a, b} {
		if _, err := p.Forward(t.Context(), addr, check("k", 1)); err != nil {
			t.Fatal(err)
		}
	}
	p.mu.RLock()
	old := p.peers[b].cc
	p.mu.RUnlock()

	dropped := time.Now()
	p.Retain([]string{a})
	// Closed once its calls have had their time (TestRetainSparesCallsInFlight).
	for s := old.GetState(); s != connectivity.Shutdown; s = old.GetState() {
		if !old.WaitForStateChange(ctx, s) {
			t.Fatalf("dropped connection is %v %v after Retain, want Shutdown after the timeout of %v", s, time.Since(dropped), timeout)
		}
	}
	p.mu.RLock()
	_, hasA := p.peers[a]
	_, hasB := p.peers[b]
	p.mu.RUnlock()
	if !hasA || hasB {
		t.Errorf("after Retain(a): has a %v, has b %v; want true, false", hasA, hasB)
	}
	// A dropped peer that comes back is dialled afresh.
	if _, err := p.Forward(t.Context(), b, check("k", 1)); err != nil {
		t.Fatal(err)
	}
}

func TestUnaryCalls(t *testing.T) {
	h := &fakeHandler{}
	addr := serve(t, h)
	p := NewPool(Config{}) // no Run: unary calls don't need it
	defer p.Close()
	unaryCalls(t, p, addr, h)
}

// unaryCalls makes every unary call of the Pool to the node at addr,
// which serves h, and checks what h saw.
func unaryCalls(t *testing.T, p *Pool, addr string, h *fakeHandler) {
	t.Helper()
	resp, err := p.ForwardNow(t.Context(), addr, check("now", 1))
	if err != nil || keyOf(resp) != "now" {
		t.Fatalf("ForwardNow = %v, %v; want the answer for now", resp, err)
	}
	if err := p.AddGlobalHits(t.Context(), addr, "me", []*peerpb.GlobalReport{{Item: &pb.CheckItem{Key: "g"}, Admitted: 4}}); err != nil {
		t.Fatal(err)
	}
	if err := p.UpdateGlobals(t.Context(), addr, "owner", []*peerpb.GlobalState{{Key: "g", Remaining: 3}}); err != nil {
		t.Fatal(err)
	}
	refused, err := p.HandOff(t.Context(), addr, "me", []*peerpb.CounterState{{Counter: []byte{1}}, {}})
	if err != nil || len(refused) != 1 || refused[0].GetIndex() != 1 || refused[0].GetReason() != peerpb.Refusal_INVALID {
		t.Fatalf("HandOff = %v, %v; want counter 1 refused as INVALID", refused, err)
	}
	if err := p.HandOffDone(t.Context(), addr, "me", 42); err != nil {
		t.Fatal(err)
	}
	if err := p.HandOffLeft(t.Context(), addr, "me", 43); err != nil {
		t.Fatal(err)
	}
	refused, err = p.Replicate(t.Context(), addr, "me", []*peerpb.CounterState{{}, {Counter: []byte{1}}})
	if err != nil || len(refused) != 1 || refused[0].GetIndex() != 0 || refused[0].GetReason() != peerpb.Refusal_INVALID {
		t.Fatalf("Replicate = %v, %v; want counter 0 refused as INVALID", refused, err)
	}
	if resp, err := p.Pull(t.Context(), addr, check("held", 1)); err != nil || keyOf(resp) != "held" {
		t.Fatalf("Pull of a held key = %v, %v; want its answer", resp, err)
	}
	if resp, err := p.Pull(t.Context(), addr, check("elsewhere", 1)); !errors.Is(err, ErrNotHere) {
		t.Fatalf("Pull of a key not held = %v, %v; want ErrNotHere", resp, err)
	}
	resp, err = p.Relay(t.Context(), addr, check("relayed", 1))
	if err != nil || keyOf(resp) != "relayed" || h.relays.Load() != 1 {
		t.Fatalf("Relay = %v, %v with %d relays; want the answer for relayed, one relay", resp, err, h.relays.Load())
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.hits) != 1 || h.hits[0].GetItem().GetKey() != "g" || h.hits[0].GetAdmitted() != 4 || h.reportedBy != "me" ||
		len(h.states) != 1 || h.states[0].GetRemaining() != 3 || h.updatedBy != "owner" || h.handedBy != "me" || h.replicaOf != "me" {
		t.Errorf("handler saw hits %v from %q, states %v from %q, hand-off from %q", h.hits, h.reportedBy, h.states, h.updatedBy, h.handedBy)
	}
	if !slices.Equal(h.done, []string{"me:42", "me:43"}) || !slices.Equal(h.left, []string{"me:43"}) {
		t.Errorf("handler saw HandOffDone %v and Left %v, want [me:42 me:43] and [me:43]", h.done, h.left)
	}
}

// TestHandOffLeftRefused: a last word the node does not take comes back
// as FAILED_PRECONDITION, so that the leaving node can tell it apart from
// a node it cannot reach.
func TestHandOffLeftRefused(t *testing.T) {
	h := &fakeHandler{leftErr: errors.New("still in my ring")}
	addr := serve(t, h)
	p := NewPool(Config{})
	defer p.Close()
	if err := p.HandOffLeft(t.Context(), addr, "me", 7); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("HandOffLeft to a node that does not take it = %v, want FAILED_PRECONDITION", err)
	}
}

func TestMetrics(t *testing.T) {
	h := &fakeHandler{}
	addr := serve(t, h)
	reg := prometheus.NewRegistry()
	p, _ := startPool(t, Config{Registerer: reg, BatchWait: time.Millisecond})
	if err := forwardAll(t.Context(), p, addr, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ForwardNow(t.Context(), closedAddr(t), check("x", 1)); err == nil {
		t.Fatal("ForwardNow to a closed port succeeded")
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "/" + l.GetValue()
			}
			if hist := m.GetHistogram(); hist != nil {
				got[name] = hist.GetSampleSum()
				got[name+"/count"] = float64(hist.GetSampleCount())
			} else {
				got[name] = m.GetCounter().GetValue()
			}
		}
	}
	for name, want := range map[string]float64{
		"ringlimit_peer_batch_size":                               3, // items
		"ringlimit_peer_forward_duration_seconds/batched/count":   3,
		"ringlimit_peer_forward_duration_seconds/unbatched/count": 1,
		"ringlimit_peer_forward_errors_total/batched":             0,
		"ringlimit_peer_forward_errors_total/unbatched":           1,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
}

// TestRetainSparesCallsInFlight: dropping a peer fails the calls gathered
// for it and not sent, while a call already sent gets its answer: a node
// that has left the ring still answers what it was sent (node's leave),
// and a lost answer had the check decided again elsewhere.
func TestRetainSparesCallsInFlight(t *testing.T) {
	h := &fakeHandler{block: make(chan struct{}), entered: make(chan struct{}, 1)}
	addr := serve(t, h)
	p, _ := startPool(t, Config{BatchWait: time.Hour, Timeout: time.Hour})
	sent, gathered := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := p.Forward(t.Context(), addr, check("a", 1))
		sent <- err
	}()
	<-h.entered // the call went at once, and blocks in the handler
	go func() {
		_, err := p.Forward(t.Context(), addr, check("b", 1))
		gathered <- err
	}()
	c, _ := p.peer(addr)
	for c.batch.Gathered() == 0 { // behind the batch in flight
		time.Sleep(time.Millisecond) // polling, not waiting for an effect
	}
	p.Retain(nil)
	select {
	case err := <-gathered:
		if !errors.Is(err, ErrUnreachable) {
			t.Errorf("a call gathered for a dropped peer got %v, want ErrUnreachable", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a call gathered for a dropped peer still waits")
	}
	close(h.block)
	select {
	case err := <-sent:
		if err != nil {
			t.Errorf("a call in flight when its peer was dropped: %v, want its answer", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a call in flight when its peer was dropped has no answer")
	}
}
