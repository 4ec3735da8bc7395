package conns

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// dialFrom connects to addr from the loopback address ip: Linux routes all
// of 127.0.0.0/8 to the loopback interface, so tests can be several hosts.
func dialFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c: a read ends with EOF
// or a reset, rather than waiting (up to a generous deadline).
func closedByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// serve accepts from l until it is closed, sending what it accepts.
func serve(t *testing.T, l net.Listener) <-chan net.Conn {
	accepted := make(chan net.Conn, 100)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		l.Close()
		for c := range accepted {
			c.Close()
		}
	})
	return accepted
}

func listen(t *testing.T, conf Config) *Listener {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return Limit(inner, conf)
}

func TestPerSource(t *testing.T) {
	m := NewMetrics(nil)
	l := listen(t, Config{Name: "grpc", Pending: Bounds{PerSource: 2}, Max: 10, Metrics: m})
	accepted := serve(t, l)
	addr := l.Addr().String()
	dialFrom(t, "127.0.0.2", addr)
	dialFrom(t, "127.0.0.2", addr)
	first := <-accepted
	<-accepted
	if third := dialFrom(t, "127.0.0.2", addr); !closedByServer(third) {
		t.Fatal("a third connection from 127.0.0.2 was kept open, bound 2")
	}
	if got := testutil.ToFloat64(m.refused.WithLabelValues("grpc", "per_source")); got != 1 {
		t.Errorf("refused per source: %v, want 1", got)
	}
	// Another source is served while 127.0.0.2 is at its bound.
	dialFrom(t, "127.0.0.1", addr)
	<-accepted
	if got := testutil.ToFloat64(m.open.WithLabelValues("grpc")); got != 3 {
		t.Errorf("open: %v, want 3", got)
	}
	// A connection closed (by the server, as a timeout does, twice) frees
	// its slot once.
	first.Close()
	first.Close()
	dialFrom(t, "127.0.0.2", addr)
	<-accepted
	if !closedByServer(dialFrom(t, "127.0.0.2", addr)) {
		t.Error("the source's bound was not restored after its slot was reused")
	}
}

func TestTotal(t *testing.T) {
	m := NewMetrics(nil)
	l := listen(t, Config{Name: "http", Max: 2, Metrics: m})
	accepted := serve(t, l)
	addr := l.Addr().String()
	dialFrom(t, "127.0.0.2", addr)
	dialFrom(t, "127.0.0.3", addr)
	first := <-accepted
	<-accepted
	if !closedByServer(dialFrom(t, "127.0.0.4", addr)) {
		t.Fatal("a third connection was kept open, total bound 2")
	}
	if got := testutil.ToFloat64(m.refused.WithLabelValues("http", "total")); got != 1 {
		t.Errorf("refused in total: %v, want 1", got)
	}
	first.Close()
	dialFrom(t, "127.0.0.4", addr)
	select {
	case <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("a connection was not accepted after a slot was freed")
	}
}

// TestCloseConn: a server closes one connection by its client's address;
// the client sees it closed, and its slot is free.
func TestCloseConn(t *testing.T) {
	l := listen(t, Config{Pending: Bounds{PerSource: 1}})
	accepted := serve(t, l)
	c := dialFrom(t, "127.0.0.2", l.Addr().String())
	server := <-accepted
	if !l.CloseConn(server.RemoteAddr()) {
		t.Fatal("CloseConn found no connection from the client's address")
	}
	if !closedByServer(c) {
		t.Error("the client's connection is still open")
	}
	if l.CloseConn(server.RemoteAddr()) {
		t.Error("CloseConn found the closed connection again")
	}
	dialFrom(t, "127.0.0.2", l.Addr().String())
	<-accepted // the source's one slot is free again
}

// refusedFor is the count of refusals of listener name for reason.
func refusedFor(m *Metrics, name, reason string) float64 {
	return testutil.ToFloat64(m.refused.WithLabelValues(name, reason))
}

// TestEstablishedMovesPools: a connection is pending, in the pending
// pool's share of its source, until its server says it made a request
// (by its address, as a gRPC server does, or by the connection, as an
// HTTP server does); then its source may open another pending one, and
// it counts in the established pool's share, where a connection beyond
// the share is closed as it makes its first request.
func TestEstablishedMovesPools(t *testing.T) {
	m := NewMetrics(nil)
	l := listen(t, Config{Name: "peer", Pending: Bounds{PerSource: 1}, PerSource: 2, Metrics: m})
	accepted := serve(t, l)
	addr := l.Addr().String()
	dialFrom(t, "127.0.0.2", addr)
	first := <-accepted
	if !closedByServer(dialFrom(t, "127.0.0.2", addr)) {
		t.Fatal("a second pending connection from 127.0.0.2 was kept, pending share 1")
	}
	l.Established(first.RemoteAddr())
	dialFrom(t, "127.0.0.2", addr)
	second := <-accepted
	Established(second)
	if got := testutil.ToFloat64(m.pending.WithLabelValues("peer")); got != 0 {
		t.Errorf("pending: %v, want 0 once both made a request", got)
	}
	third := dialFrom(t, "127.0.0.2", addr)
	Established(<-accepted)
	if !closedByServer(third) {
		t.Fatal("a third connection from 127.0.0.2 was kept as it made a request, established share 2")
	}
	if got := refusedFor(m, "peer", "per_source"); got != 2 {
		t.Errorf("refused per source: %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.open.WithLabelValues("peer")); got != 2 {
		t.Errorf("open: %v, want 2", got)
	}
}

// TestRangeShare: the addresses of one /24 share their range's share; an
// address of another range is served while it is full.
func TestRangeShare(t *testing.T) {
	m := NewMetrics(nil)
	l := listen(t, Config{Name: "grpc", Pending: Bounds{PerRange: 2}, Metrics: m})
	accepted := serve(t, l)
	addr := l.Addr().String()
	dialFrom(t, "127.0.0.2", addr)
	dialFrom(t, "127.0.0.3", addr)
	<-accepted
	<-accepted
	if !closedByServer(dialFrom(t, "127.0.0.4", addr)) {
		t.Fatal("a third connection from 127.0.0.0/24 was kept, range share 2")
	}
	dialFrom(t, "127.0.1.2", addr)
	<-accepted
	if got := refusedFor(m, "grpc", "per_range"); got != 1 {
		t.Errorf("refused per range: %v, want 1", got)
	}
}

// TestNewcomerTakesThePlaceOfTheHeaviest: when the pending pool is full,
// a connection from a range that holds fewer pending connections than
// another takes the place of that range's oldest, which is closed; one
// from the range holding most is refused.
func TestNewcomerTakesThePlaceOfTheHeaviest(t *testing.T) {
	m := NewMetrics(nil)
	l := listen(t, Config{Name: "peer", Pending: Bounds{Max: 3}, Metrics: m})
	accepted := serve(t, l)
	addr := l.Addr().String()
	oldest := dialFrom(t, "127.0.0.2", addr)
	<-accepted
	dialFrom(t, "127.0.0.3", addr)
	dialFrom(t, "127.0.0.4", addr)
	<-accepted
	<-accepted
	dialFrom(t, "127.0.1.2", addr)
	<-accepted
	if !closedByServer(oldest) {
		t.Fatal("the oldest pending connection of the range holding most was kept when a newcomer came")
	}
	if !closedByServer(dialFrom(t, "127.0.0.5", addr)) {
		t.Fatal("a newcomer of the range holding most was kept in a full pool")
	}
	if got := refusedFor(m, "peer", "evicted"); got != 1 {
		t.Errorf("evicted: %v, want 1", got)
	}
	if got := refusedFor(m, "peer", "pending"); got != 1 {
		t.Errorf("refused for a full pending pool: %v, want 1", got)
	}
}

// TestKeptSourcesGetIn: a source that Kept names is admitted when the
// pool, the listener and its range are full, taking no one's place, up
// to PerSource connections; and its pending connections are
// never the place a stranger takes.
func TestKeptSourcesGetIn(t *testing.T) {
	m := NewMetrics(nil)
	member := netip.MustParseAddr("127.0.0.1")
	l := listen(t, Config{Name: "peer", Max: 1, PerSource: 2, Pending: Bounds{Max: 1, PerRange: 1},
		Kept: func(a netip.Addr) bool { return a == member }, Metrics: m})
	accepted := serve(t, l)
	addr := l.Addr().String()
	stranger := dialFrom(t, "127.0.0.2", addr)
	<-accepted
	dialFrom(t, "127.0.0.1", addr)
	Established(<-accepted)
	memberPending := dialFrom(t, "127.0.0.1", addr)
	<-accepted
	if !closedByServer(dialFrom(t, "127.0.0.1", addr)) {
		t.Fatal("a third connection of a kept source was kept, its bound 2")
	}
	// A stranger of another range takes the place of the stranger
	// pending, not of the member's.
	second := dialFrom(t, "127.0.1.2", addr)
	<-accepted
	if !closedByServer(stranger) {
		t.Fatal("a newcomer of another range did not take the pending stranger's place")
	}
	dialFrom(t, "127.0.2.2", addr)
	<-accepted
	if !closedByServer(second) {
		t.Fatal("a newcomer of a third range did not take the place of the second stranger")
	}
	memberPending.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := memberPending.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the kept source's pending connection: %v, want it open", err)
	}
}

// pipes is a listener of in-memory connections, for tests of time in a
// synctest bubble.
type pipes struct {
	conns  chan net.Conn
	closed chan struct{}
}

func newPipes() *pipes { return &pipes{conns: make(chan net.Conn), closed: make(chan struct{})} }

func (p *pipes) Accept() (net.Conn, error) {
	select {
	case c := <-p.conns:
		return c, nil
	case <-p.closed:
		return nil, net.ErrClosed
	}
}
func (p *pipes) Close() error   { close(p.closed); return nil }
func (p *pipes) Addr() net.Addr { return &net.TCPAddr{} }

// dial returns the client's end of a new connection.
func (p *pipes) dial() net.Conn {
	client, server := net.Pipe()
	p.conns <- server
	return client
}

// TestPendingTimeout: a connection that makes no request within
// PendingTimeout is closed then, and counted; one that does is kept.
func TestPendingTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewMetrics(nil)
		p := newPipes()
		l := Limit(p, Config{Name: "resp", PendingTimeout: 10 * time.Second, Metrics: m})
		accepted := make(chan net.Conn)
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				accepted <- c
			}
		}()
		defer l.Close()
		silent := p.dial()
		<-accepted
		speaking := p.dial()
		Established(<-accepted)
		closed := make(chan time.Duration, 2)
		start := time.Now()
		for _, c := range []net.Conn{silent, speaking} {
			go func() {
				c.Read(make([]byte, 1))
				closed <- time.Since(start)
			}()
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if len(closed) != 1 || <-closed != 10*time.Second {
			t.Errorf("want the silent connection closed at 10s and no other")
		}
		if got := refusedFor(m, "resp", "timeout"); got != 1 {
			t.Errorf("timed out: %v, want 1", got)
		}
		speaking.Close()
		silent.Close()
		synctest.Wait()
	})
}

// BenchmarkEstablished is what a gRPC server pays at each RPC to say its
// connection made a request, once it has: a lookup by address, no lock.
func BenchmarkEstablished(b *testing.B) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	l := Limit(inner, Config{})
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	sc, err := l.Accept()
	if err != nil {
		b.Fatal(err)
	}
	defer sc.Close()
	remote := sc.RemoteAddr()
	l.Established(remote)
	b.ReportAllocs()
	for b.Loop() {
		l.Established(remote)
	}
}
