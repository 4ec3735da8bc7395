package cluster

import (
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
)

// countingTransport is memberlist's own NetTransport that counts the bytes
// of gossip: every datagram this node sends, and both directions of every
// TCP stream (push/pull state exchange, fallback probes) it opens. Streams
// other nodes open to this one are counted by them, so summed over the
// cluster every byte on the wire is counted once, by the node that sent the
// datagram or opened the stream. memberlist reports the same to
// go-metrics' global sink, which this project does not install: a global
// cannot tell apart several clusters in one process, as tests run them.
//
// It is safe for concurrent use, as memberlist requires of a Transport.
type countingTransport struct {
	*memberlist.NetTransport // the methods not counted, as they are
	udp, tcp                 prometheus.Counter
}

// newTransport binds memberlist's NetTransport to host:port, on another
// free port if port is 0 and the first one the kernel chose was taken for
// one of TCP and UDP (memberlist's own retry, which it does only for the
// transport it makes itself). It returns the transport and the port bound.
func newTransport(host string, port int, m *metrics, ml *memberlist.Config) (*countingTransport, int, error) {
	conf := &memberlist.NetTransportConfig{
		BindAddrs:    []string{host},
		BindPort:     port,
		Logger:       ml.Logger,
		MetricLabels: ml.MetricLabels,
	}
	tries := 1
	if port == 0 {
		tries = 10
	}
	var err error
	for range tries {
		var nt *memberlist.NetTransport
		nt, err = memberlist.NewNetTransport(conf)
		if err == nil {
			return &countingTransport{NetTransport: nt, udp: m.gossipUDP, tcp: m.gossipTCP}, nt.GetAutoBindPort(), nil
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, 0, fmt.Errorf("bind gossip to %s: %w", net.JoinHostPort(host, fmt.Sprint(port)), err)
}

func (t *countingTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	t.udp.Add(float64(len(b)))
	return t.NetTransport.WriteTo(b, addr)
}

func (t *countingTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	t.udp.Add(float64(len(b)))
	return t.NetTransport.WriteToAddress(b, a)
}

func (t *countingTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	conn, err := t.NetTransport.DialTimeout(addr, timeout)
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: conn, bytes: t.tcp}, nil
}

func (t *countingTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	conn, err := t.NetTransport.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: conn, bytes: t.tcp}, nil
}

// countingConn counts the bytes read from and written to a stream.
type countingConn struct {
	net.Conn
	bytes prometheus.Counter
}

func (c countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.bytes.Add(float64(n))
	return n, err
}

func (c countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.bytes.Add(float64(n))
	return n, err
}
