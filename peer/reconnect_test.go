package peer

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

// TestReconnectsSoonAfterThePeerReturns: a peer that refused connections
// for a few seconds (its backoff has grown, as across a partition) is
// reached again within a few seconds of listening again, not after
// gRPC's default backoff, which grows towards two minutes. The bound is
// five times the longest wait between attempts, for a loaded machine.
func TestReconnectsSoonAfterThePeerReturns(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens: every attempt is refused
	p := NewPool(Config{})
	t.Cleanup(func() { p.Close() })
	call := func() error { return forwardWithin(t, p, addr, 200*time.Millisecond) }
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if call() == nil {
			t.Fatal("a call succeeded with nothing listening")
		}
	}
	back := time.Now()
	lis, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", addr, err)
	}
	serveListener(t, lis, NewServer(&fakeHandler{}, nil))
	for call() != nil {
		if time.Since(back) > 5*time.Second {
			t.Fatalf("the peer listens again since %v and calls still fail", time.Since(back))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestResetDialsAfresh: Reset closes a ready connection, and the next
// call dials a new one and is answered; an address with no connection,
// or one not up, is left alone.
func TestResetDialsAfresh(t *testing.T) {
	addr := serve(t, &fakeHandler{})
	p := NewPool(Config{})
	t.Cleanup(func() { p.Close() })
	if p.Reset(addr) {
		t.Error("Reset of an address never called reported a reset")
	}
	if _, err := p.ForwardNow(t.Context(), addr, requests(1, 1)[0]); err != nil {
		t.Fatal(err)
	}
	first := awaitReported(t, p, addr) // Reset acts on the report
	if !p.Reset(addr) {
		t.Fatal("Reset of a ready connection did not reset it")
	}
	if _, err := p.ForwardNow(t.Context(), addr, requests(1, 1)[0]); err != nil {
		t.Fatalf("the call after a reset: %v", err)
	}
	if again, _ := p.peer(addr); again == first {
		t.Error("the call after a reset went on the old connection")
	}
}

// TestReviveEndsTheBackoff: a connection whose peer refused it waits out
// its backoff between attempts (here an hour, to make the wait plain);
// Revive has it try again at once, so a call soon after the peer listens
// again is answered.
func TestReviveEndsTheBackoff(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	hour := grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: time.Hour, Multiplier: 1, MaxDelay: time.Hour}})
	p := NewPool(Config{DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), hour}})
	t.Cleanup(func() { p.Close() })
	if p.Revive(addr) {
		t.Error("Revive of an address never called reported a revival")
	}
	call := func() error { return forwardWithin(t, p, addr, time.Second) }
	if call() == nil {
		t.Fatal("a call succeeded with nothing listening")
	}
	awaitState(t, p, addr, connectivity.TransientFailure) // refused
	lis, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", addr, err)
	}
	serveListener(t, lis, NewServer(&fakeHandler{}, nil))
	if err := call(); err == nil {
		t.Fatal("a call within the hour's backoff succeeded without Revive: the test shows nothing")
	}
	if !p.Revive(addr) {
		t.Fatal("Revive of a failing connection did not revive it")
	}
	deadline := time.Now().Add(20 * time.Second)
	for err := call(); err != nil; err = call() {
		if time.Now().After(deadline) {
			t.Fatalf("after Revive, calls still fail after 20s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReviveRedialsAConnectionStillConnecting: a dial sent into a network
// cut hangs until its timeout (its SYN lost); Revive drops the connection
// whose attempt is in flight, so that the next call dials afresh and is
// answered, rather than waiting for the lost attempt to time out.
func TestReviveRedialsAConnectionStillConnecting(t *testing.T) {
	addr := serve(t, &fakeHandler{})
	var cut atomic.Bool
	cut.Store(true)
	dial := grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
		if cut.Load() {
			<-ctx.Done() // lost in the cut
			return nil, ctx.Err()
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", a)
	})
	slow := grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: time.Hour, Multiplier: 1, MaxDelay: time.Hour}, MinConnectTimeout: time.Hour})
	p := NewPool(Config{DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), dial, slow}})
	t.Cleanup(func() { p.Close() })
	call := func() error { return forwardWithin(t, p, addr, time.Second) }
	if call() == nil {
		t.Fatal("a call succeeded through the cut")
	}
	c, _ := p.peer(addr)
	if s := c.cc.GetState(); s != connectivity.Connecting {
		t.Fatalf("the connection into the cut is %v, want Connecting", s)
	}
	cut.Store(false) // healed; the attempt in flight stays lost
	if call() == nil {
		t.Fatal("a call succeeded on the attempt lost in the cut: the test shows nothing")
	}
	if !p.Revive(addr) {
		t.Fatal("Revive of a connection still connecting did not revive it")
	}
	if err := call(); err != nil {
		t.Fatalf("the call after Revive: %v", err)
	}
}

// TestReviveSparesCallsInFlight: a connection whose first dial is still in
// flight when Revive comes (a node that has just started, whose ring
// changes as it joins) is replaced for the next calls, but the forwards
// already waiting on it, batched or not, are answered once the dial
// completes. Before, Revive closed it under them ("the client connection
// is closing") and they were failed over while their owner was there.
func TestReviveSparesCallsInFlight(t *testing.T) {
	addr := serve(t, &fakeHandler{})
	release := make(chan struct{})
	var dials atomic.Int32
	dial := grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
		if dials.Add(1) == 1 {
			select { // the first dial is slow: a handshake on a busy machine
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", a)
	})
	p, _ := startPool(t, Config{Name: "node-a", Timeout: 10 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), dial}})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	go func() { _, err := p.ForwardNow(ctx, addr, requests(1, 1)[0]); errs <- err }()
	go func() { _, err := p.Forward(ctx, addr, check("batched", 1)); errs <- err }()
	c, _ := p.peer(addr)
	for c.cc.GetState() != connectivity.Connecting {
		if ctx.Err() != nil {
			t.Fatalf("the connection is %v, want Connecting", c.cc.GetState())
		}
		time.Sleep(time.Millisecond) // polling, not waiting for an effect
	}
	if !p.Revive(addr) {
		t.Fatal("Revive of a connection still connecting did not revive it")
	}
	if _, err := p.ForwardNow(ctx, addr, requests(1, 1)[0]); err != nil {
		t.Fatalf("a call after Revive, on a new connection: %v", err)
	}
	close(release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("a forward in flight when its connection was revived: %v", err)
		}
	}
}

// forwardWithin forwards one check to addr through p, at most d long, and
// returns its error.
func forwardWithin(t *testing.T, p *Pool, addr string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	_, err := p.ForwardNow(ctx, addr, requests(1, 1)[0])
	return err
}

// awaitReported waits for p's connection to addr, which a call has gone
// through, to report itself ready, and returns it. gRPC lets calls
// through a new connection (its picker) a moment before it reports the
// connection ready, and a loaded machine can stretch that moment: what
// acts on the report (Reset, a stream's opening) sees the connection as
// not connected until then.
func awaitReported(t *testing.T, p *Pool, addr string) *conn {
	t.Helper()
	return awaitState(t, p, addr, connectivity.Ready)
}

// awaitState waits up to 20s for p's connection to addr to report want,
// and returns it.
func awaitState(t *testing.T, p *Pool, addr string, want connectivity.State) *conn {
	t.Helper()
	c, _ := p.peer(addr)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for s := c.cc.GetState(); s != want; s = c.cc.GetState() {
		if !c.cc.WaitForStateChange(ctx, s) {
			t.Fatalf("the connection to %s is %v, not %v, after 20s", addr, s, want)
		}
	}
	return c
}
