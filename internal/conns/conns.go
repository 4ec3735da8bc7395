// Package conns bounds the connections a listener keeps open, in all and
// from each source address. A connection beyond a bound is closed as soon
// as it is accepted, rather than left in the kernel's backlog: a client
// that waits there cannot tell a full node from a slow one and times out,
// while one refused at once reconnects elsewhere or later, and the refusal
// is counted.
//
// The bound per source is what keeps one host from taking every slot: a
// flood of idle connections from one address fills its own share and no
// more, and clients from other addresses are still accepted. A proxy such
// as Envoy opens many connections from one address (one per worker thread
// and upstream cluster, more under load), so the bound per source must be
// well above what one proxy opens.
package conns

import (
	"errors"
	"net"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
)

// Config bounds the connections of a Listener.
type Config struct {
	// Name labels the listener's metrics ("http", "grpc", "peer", "resp").
	Name string
	// Max bounds the connections open at once, PerSource those from one
	// IP address; zero means no bound.
	Max, PerSource int
	// Metrics, if not nil, counts refusals and open connections; nil
	// means they are counted nowhere.
	Metrics *Metrics
}

// Metrics are the counters of every Listener of a node, labelled by
// listener. The zero value is not usable; use NewMetrics.
type Metrics struct {
	refused *prometheus.CounterVec
	open    *prometheus.GaugeVec
}

// NewMetrics returns the metrics of a node's listeners, registered with
// reg if it is not nil: ringlimit_connections_refused_total{listener,reason}
// and ringlimit_connections_open{listener}.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_connections_refused_total",
			Help: "Connections closed as soon as they were accepted, by listener (http, grpc, peer, resp) and reason: total (--max-conns open on the listener) or per_source (--max-conns-per-source open from the client's IP address).",
		}, []string{"listener", "reason"}),
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ringlimit_connections_open",
			Help: "Connections open, by listener (http, grpc, peer, resp).",
		}, []string{"listener"}),
	}
	if reg != nil {
		reg.MustRegister(m.refused, m.open)
	}
	return m
}

// Listener is a net.Listener whose Accept returns only connections within
// its bounds. It is safe for concurrent use.
type Listener struct {
	net.Listener
	conf             Config
	refusedTotal     prometheus.Counter
	refusedPerSource prometheus.Counter
	gauge            prometheus.Gauge

	mu       sync.Mutex
	total    int
	bySource map[string]int   // IP address -> connections open; no zero entries
	open     map[string]*conn // remote address -> the connection open from it
}

// Limit returns l bounded as conf says.
func Limit(l net.Listener, conf Config) *Listener {
	m := conf.Metrics
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Listener{Listener: l, conf: conf, bySource: map[string]int{}, open: map[string]*conn{},
		refusedTotal:     m.refused.WithLabelValues(conf.Name, "total"),
		refusedPerSource: m.refused.WithLabelValues(conf.Name, "per_source"),
		gauge:            m.open.WithLabelValues(conf.Name),
	}
}

// Accept waits for a connection within the bounds and returns it; those
// beyond them are closed and counted meanwhile. Closing the returned
// connection frees its slot.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc := &conn{Conn: c, l: l, src: source(c.RemoteAddr()), remote: c.RemoteAddr().String()}
		if refused := l.enter(lc); refused != nil {
			c.Close()
			refused.Inc()
			continue
		}
		return lc, nil
	}
}

// enter takes a slot for c, or returns the counter of the bound that
// refuses it.
func (l *Listener) enter(c *conn) prometheus.Counter {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.conf.Max > 0 && l.total >= l.conf.Max:
		return l.refusedTotal
	case l.conf.PerSource > 0 && l.bySource[c.src] >= l.conf.PerSource:
		return l.refusedPerSource
	}
	l.total++
	l.bySource[c.src]++
	l.open[c.remote] = c
	l.gauge.Inc()
	return nil
}

func (l *Listener) leave(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.bySource[c.src]--; l.bySource[c.src] == 0 {
		delete(l.bySource, c.src)
	}
	delete(l.open, c.remote)
	l.gauge.Dec()
}

// CloseConn closes the connection open from the remote address remote
// (as its RemoteAddr says), if there is one, and reports whether there
// was: a server that finds a client of a connection misbehaving, such as
// one that reads nothing of what it is sent, ends it whole.
func (l *Listener) CloseConn(remote net.Addr) bool {
	l.mu.Lock()
	c := l.open[remote.String()]
	l.mu.Unlock()
	if c == nil {
		return false
	}
	c.Close()
	return true
}

// source is the IP address of a connection's remote end: connections from
// one host share it whatever their ports.
func source(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// conn gives its slot back once, at its first Close.
type conn struct {
	net.Conn
	l      *Listener
	src    string // its remote IP address
	remote string // its remote address
	once   sync.Once
}

// SyscallConn returns the socket's raw connection, for a server that reads
// and writes it itself (package resp); Close still gives the slot back.
func (c *conn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.leave(c) })
	return err
}
