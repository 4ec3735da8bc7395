package cluster

import (
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestCountingTransport: the datagrams a node sends, and both directions
// of a stream it opens, are counted byte for byte; the other side of the
// stream counts nothing, so each byte is counted once.
func TestCountingTransport(t *testing.T) {
	newT := func() *countingTransport {
		m, err := newMetrics(nil)
		if err != nil {
			t.Fatal(err)
		}
		tr, port, err := newTransport("127.0.0.1", 0, m, memberlist.DefaultLocalConfig())
		if err != nil {
			t.Fatal(err)
		}
		if port == 0 || port != tr.GetAutoBindPort() {
			t.Fatalf("newTransport port %d, transport bound %d", port, tr.GetAutoBindPort())
		}
		t.Cleanup(func() { tr.Shutdown() })
		return tr
	}
	a, b := newT(), newT()
	bAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(b.GetAutoBindPort()))

	if _, err := a.WriteTo(make([]byte, 100), bAddr); err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteToAddress(make([]byte, 20), memberlist.Address{Addr: bAddr, Name: "b"}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case <-b.PacketCh():
		case <-time.After(10 * time.Second):
			t.Fatal("b received no packet")
		}
	}

	conn, err := a.DialAddressTimeout(memberlist.Address{Addr: bAddr, Name: "b"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	var in io.ReadWriteCloser
	select {
	case in = <-b.StreamCh():
	case <-time.After(10 * time.Second):
		t.Fatal("b accepted no stream")
	}
	defer in.Close()
	if _, err := io.ReadFull(in, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Write(make([]byte, 7)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(conn, make([]byte, 7)); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"a udp", value(t, a.udp), 120},
		{"a tcp", value(t, a.tcp), 17},
		{"b udp", value(t, b.udp), 0},
		{"b tcp", value(t, b.tcp), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v bytes counted, want %v", c.name, c.got, c.want)
		}
	}
}

func value(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
