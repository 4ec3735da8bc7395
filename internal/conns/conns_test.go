package conns

import (
	"errors"
	"net"
	"os"
	"testing"
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
	l := listen(t, Config{Name: "grpc", PerSource: 2, Max: 10, Metrics: m})
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
	l := listen(t, Config{PerSource: 1})
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
