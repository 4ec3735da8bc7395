// Package conns bounds the connections a listener keeps open: in all, from
// each source address (PerSource) and from each address range (PerRange:
// a /24 or a /64), and apart for connections that have not yet made a
// request (Established). A connection beyond a bound is closed as soon as
// it is accepted, not left in the kernel's backlog, so its client can
// tell and go elsewhere. Pending connections have a pool of their own
// (Config.Pending) and a timeout (Config.PendingTimeout), and a newcomer
// from a range that holds fewer of them takes the place of the busiest
// range's oldest, so a flood of connections that never speak cannot keep
// another range out. Config.Kept names sources admitted ahead of strangers
// (the cluster's members on the peer port), held to their per-source
// bound alone. See docs/design-ports.md, "Connections and streams earn
// their slots".
package conns

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Bounds bound the connections of a pool: Max in all, PerSource from one
// IP address, PerRange from one range (an IPv4 /24, an IPv6 /64). Zero
// means no bound.
type Bounds struct {
	Max, PerSource, PerRange int
}

// Config bounds the connections of a Listener.
type Config struct {
	// Name labels the listener's metrics ("http", "grpc", "peer", "resp").
	Name string
	// Max bounds the connections open at once, pending or established;
	// PerSource and PerRange bound those that have made a request from
	// one IP address and from one range. Zero means no bound.
	Max, PerSource, PerRange int
	// Pending bounds the connections that have not: in all, by source and
	// by range.
	Pending Bounds
	// PendingTimeout, if positive, closes a connection still pending that
	// long after its accept.
	PendingTimeout time.Duration
	// Kept, if not nil, reports whether connections from a source are
	// admitted ahead of strangers: beyond Max, the pools and the range
	// shares, up to PerSource (if set) from that source. It is
	// asked only of a connection that a bound would refuse, so it may be
	// slow.
	Kept func(netip.Addr) bool
	// Metrics, if not nil, counts refusals and open connections; nil
	// means they are counted nowhere.
	Metrics *Metrics
}

// The reasons of ringlimit_connections_refused_total.
const (
	reasonTotal   = "total"      // Max open on the listener
	reasonPending = "pending"    // Pending.Max pending, none to take the place of
	reasonSource  = "per_source" // the source's share of a pool
	reasonRange   = "per_range"  // the range's share of a pool
	reasonEvicted = "evicted"    // a pending connection whose place a newcomer took
	reasonTimeout = "timeout"    // pending for PendingTimeout
)

// Metrics are the counters of every Listener of a node, labelled by
// listener. The zero value is not usable; use NewMetrics.
type Metrics struct {
	refused *prometheus.CounterVec
	open    *prometheus.GaugeVec
	pending *prometheus.GaugeVec
}

// NewMetrics returns the metrics of a node's listeners, registered with
// reg if it is not nil: ringlimit_connections_refused_total{listener,reason},
// ringlimit_connections_open{listener} and
// ringlimit_connections_pending{listener}.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_connections_refused_total",
			Help: "Connections closed as soon as they were accepted, or before their first request, by listener (http, grpc, peer, resp) and reason: total (--max-conns open on the listener), pending (the pool of connections that have made no request yet is full), per_source or per_range (the client's IP address, or its /24 or /64, holds its share of --max-conns-per-source), evicted (a connection that had made no request, closed for a newcomer from a range that held fewer) or timeout (no request within --handshake-timeout).",
		}, []string{"listener", "reason"}),
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ringlimit_connections_open",
			Help: "Connections open, by listener (http, grpc, peer, resp).",
		}, []string{"listener"}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ringlimit_connections_pending",
			Help: "Connections open that have made no request yet, by listener (http, grpc, peer, resp).",
		}, []string{"listener"}),
	}
	if reg != nil {
		reg.MustRegister(m.refused, m.open, m.pending)
	}
	return m
}

// Listener is a net.Listener whose Accept returns only connections within
// its bounds. It is safe for concurrent use.
type Listener struct {
	net.Listener
	conf         Config
	refused      map[string]prometheus.Counter // by reason
	gauge        prometheus.Gauge
	pendingGauge prometheus.Gauge

	// open finds a connection by its remote address (CloseConn,
	// Established), without a lock: a gRPC server marks a connection
	// established from each RPC's peer address.
	open sync.Map // netip.AddrPort -> *conn

	mu          sync.Mutex
	total       int
	pending     tally
	established tally
	// queues holds the pending connections of each range, oldest first,
	// kept sources' aside: whose place a newcomer may take.
	queues map[netip.Prefix][]*conn
}

// tally counts the connections of a pool, by source and by range; maps
// hold no zero entries.
type tally struct {
	n        int
	bySource map[netip.Addr]int
	byRange  map[netip.Prefix]int
}

func newTally() tally {
	return tally{bySource: map[netip.Addr]int{}, byRange: map[netip.Prefix]int{}}
}

func (t *tally) add(c *conn, d int) {
	t.n += d
	if t.bySource[c.src] += d; t.bySource[c.src] == 0 {
		delete(t.bySource, c.src)
	}
	if t.byRange[c.rng] += d; t.byRange[c.rng] == 0 {
		delete(t.byRange, c.rng)
	}
}

// refuses returns the reason b refuses one more connection like c, or "".
func (t *tally) refuses(b Bounds, c *conn) string {
	switch {
	case b.PerSource > 0 && t.bySource[c.src] >= b.PerSource:
		return reasonSource
	case b.PerRange > 0 && t.byRange[c.rng] >= b.PerRange:
		return reasonRange
	}
	return ""
}

// Limit returns l bounded as conf says.
func Limit(l net.Listener, conf Config) *Listener {
	m := conf.Metrics
	if m == nil {
		m = NewMetrics(nil)
	}
	refused := map[string]prometheus.Counter{}
	for _, r := range []string{reasonTotal, reasonPending, reasonSource, reasonRange, reasonEvicted, reasonTimeout} {
		refused[r] = m.refused.WithLabelValues(conf.Name, r)
	}
	return &Listener{Listener: l, conf: conf, refused: refused,
		gauge: m.open.WithLabelValues(conf.Name), pendingGauge: m.pending.WithLabelValues(conf.Name),
		pending: newTally(), established: newTally(), queues: map[netip.Prefix][]*conn{}}
}

// Accept waits for a connection within the bounds and returns it,
// pending; those beyond them are closed and counted meanwhile. Closing
// the returned connection frees its slot.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc := &conn{Conn: c, l: l, remote: addrPort(c.RemoteAddr())}
		lc.src = lc.remote.Addr()
		lc.rng = rangeOf(lc.src)
		victim, reason := l.enter(lc, false)
		if reason != "" && l.conf.Kept != nil && l.conf.Kept(lc.src) {
			victim, reason = l.enter(lc, true)
		}
		if victim != nil {
			l.refused[reasonEvicted].Inc()
			victim.Close()
		}
		if reason != "" {
			l.refused[reason].Inc()
			c.Close()
			continue
		}
		return lc, nil
	}
}

// enter takes a pending slot for c, kept or not, or returns the reason it
// is refused; victim, if not nil, is a pending connection whose place c
// takes, for the caller to close.
func (l *Listener) enter(c *conn, kept bool) (victim *conn, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if kept {
		if b := l.conf.PerSource; b > 0 && l.pending.bySource[c.src]+l.established.bySource[c.src] >= b {
			return nil, reasonSource // a kept source's only bound
		}
		c.kept = true
		l.admit(c)
		return nil, ""
	}
	if reason := l.pending.refuses(l.conf.Pending, c); reason != "" {
		return nil, reason
	}
	full := ""
	switch {
	case l.conf.Max > 0 && l.total >= l.conf.Max:
		full = reasonTotal
	case l.conf.Pending.Max > 0 && l.pending.n >= l.conf.Pending.Max:
		full = reasonPending
	}
	if full != "" {
		if victim = l.heaviest(len(l.queues[c.rng])); victim == nil {
			return nil, full
		}
		l.remove(victim) // Close, at the caller, finds it gone
	}
	l.admit(c)
	return victim, ""
}

// heaviest returns the oldest pending connection of the range that holds
// the most, if that range holds more than held: the one a newcomer whose
// range holds held may take the place of.
func (l *Listener) heaviest(held int) *conn {
	var most []*conn
	for _, q := range l.queues {
		if len(q) > len(most) {
			most = q
		}
	}
	if len(most) <= held {
		return nil
	}
	return most[0]
}

// admit counts c pending, until PendingTimeout; l.mu is held.
func (l *Listener) admit(c *conn) {
	c.state = statePending
	if d := l.conf.PendingTimeout; d > 0 {
		c.timer = time.AfterFunc(d, c.expire)
	}
	l.total++
	l.pending.add(c, 1)
	if !c.kept {
		l.queues[c.rng] = append(l.queues[c.rng], c)
	}
	l.open.Store(c.remote, c)
	l.gauge.Inc()
	l.pendingGauge.Inc()
}

// remove uncounts c, in whichever state it is, and marks it closed; l.mu
// is held.
func (l *Listener) remove(c *conn) {
	switch c.state {
	case stateClosed:
		return
	case statePending:
		l.leavePending(c)
	case stateEstablished:
		l.established.add(c, -1)
	}
	c.state = stateClosed
	l.total--
	l.open.CompareAndDelete(c.remote, c)
	l.gauge.Dec()
}

// leavePending uncounts c from the pending pool, and stops its timer;
// l.mu is held.
func (l *Listener) leavePending(c *conn) {
	if c.timer != nil {
		c.timer.Stop()
	}
	l.pending.add(c, -1)
	l.pendingGauge.Dec()
	if c.kept {
		return
	}
	q := l.queues[c.rng]
	for i, p := range q {
		if p == c {
			q = append(q[:i], q[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(l.queues, c.rng)
	} else {
		l.queues[c.rng] = q
	}
}

// Established tells l that the connection from remote (as its RemoteAddr
// says) has made a request, so that it is pending no more: a gRPC server
// calls it from each RPC's peer address. It costs a lookup without a lock
// once the connection is established.
func (l *Listener) Established(remote net.Addr) {
	if v, ok := l.open.Load(addrPort(remote)); ok {
		v.(*conn).establish()
	}
}

// Established tells the Listener that accepted c, or the connection c is
// a TLS connection over, that it has made a request (see
// Listener.Established); for a connection of no Listener it does
// nothing. A server that has the connection itself calls it: at each
// HTTP request, at a RESP connection's first command.
func Established(c net.Conn) {
	for {
		switch x := c.(type) {
		case *conn:
			x.establish()
			return
		case interface{ NetConn() net.Conn }:
			c = x.NetConn()
		default:
			return
		}
	}
}

// CloseConn closes the connection open from the remote address remote
// (as its RemoteAddr says), if there is one, and reports whether there
// was: a server that finds a client of a connection misbehaving, such as
// one that reads nothing of what it is sent, ends it whole.
func (l *Listener) CloseConn(remote net.Addr) bool {
	v, ok := l.open.Load(addrPort(remote))
	if !ok {
		return false
	}
	v.(*conn).Close()
	return true
}

// addrPort is a's address and port; the zero AddrPort for an address
// that has none (its connections then share one source).
func addrPort(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		ap := t.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// rangeOf is the range ip belongs to: its /24 for IPv4, its /64 for
// IPv6; the zero Prefix for an invalid ip.
func rangeOf(ip netip.Addr) netip.Prefix {
	bits := 64
	if ip.Is4() {
		bits = 24
	}
	p, _ := ip.Prefix(bits)
	return p
}

// The states of a conn, guarded by its Listener's mu.
const (
	statePending = iota
	stateEstablished
	stateClosed
)

// conn gives its slot back once, at its first Close.
type conn struct {
	net.Conn
	l      *Listener
	remote netip.AddrPort
	src    netip.Addr
	rng    netip.Prefix
	kept   bool        // admitted as Config.Kept; set before it is returned
	timer  *time.Timer // closes it at PendingTimeout while pending; nil without one; guarded by l.mu

	state       int         // guarded by l.mu
	established atomic.Bool // state has been stateEstablished: no lock needed to see it
	once        sync.Once
}

// establish moves c from the pending pool to the established one, or
// closes it if its source or range holds its share there.
func (c *conn) establish() {
	if c.established.Load() {
		return
	}
	l := c.l
	l.mu.Lock()
	if c.state != statePending {
		l.mu.Unlock()
		return
	}
	reason := ""
	if !c.kept {
		reason = l.established.refuses(Bounds{PerSource: l.conf.PerSource, PerRange: l.conf.PerRange}, c)
	}
	if reason != "" {
		l.remove(c)
		l.mu.Unlock()
		l.refused[reason].Inc()
		c.Close()
		return
	}
	l.leavePending(c)
	c.state = stateEstablished
	l.established.add(c, 1)
	c.established.Store(true)
	l.mu.Unlock()
}

// expire closes c if it is still pending: PendingTimeout has passed.
func (c *conn) expire() {
	l := c.l
	l.mu.Lock()
	pending := c.state == statePending
	if pending {
		l.remove(c) // so that a request arriving meanwhile finds it closed
	}
	l.mu.Unlock()
	if pending {
		l.refused[reasonTimeout].Inc()
		c.Close()
	}
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
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.remove(c)
		c.l.mu.Unlock()
	})
	return err
}
