package node

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/tap"

	"github.com/ringlimit/ringlimit/internal/admit"
	"github.com/ringlimit/ringlimit/internal/conns"
	"github.com/ringlimit/ringlimit/internal/mux"
)

// The defaults of the Config fields that bound how long a connection or
// a stream holds its slot without earning it (see docs/security.md,
// "Connection and stream slots").
const (
	// DefaultMaxConnsPerSource leaves room for a proxy: Envoy opens a
	// connection per worker thread to each upstream host, and more under
	// load, and a node behind a NAT or a load balancer sees many clients
	// under one address. It is an eighth of DefaultMaxConns, so that one
	// address cannot take more than that.
	DefaultMaxConnsPerSource = 512
	// DefaultHandshakeTimeout bounds a connection's TLS and HTTP/2
	// handshakes, and an HTTP request's headers: a few round trips, even
	// across regions.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultIdleTimeout is how long a connection that carries no request
	// is kept: clients reconnect at once when they need one again.
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultStreamSendTimeout is how long an answer on a CheckStream may
	// wait for its client to read: a client that reads answers as they
	// come (the Go client does) never waits more than a round trip.
	DefaultStreamSendTimeout = 10 * time.Second
	// DefaultStreamIdleTimeout is how long a CheckStream may go without a
	// request before its client is asked to end it.
	DefaultStreamIdleTimeout = 5 * time.Minute
	// DefaultRequestTimeout bounds a unary RPC on the client port, its
	// message included: a check forwarded to its owner gives up after 2s
	// (peer.DefaultTimeout), and nothing else a node does for a client
	// takes longer.
	DefaultRequestTimeout = 30 * time.Second
)

// keepaliveTime and keepaliveTimeout make gRPC ping a client that has
// sent nothing for a minute, and close its connection if nothing arrives
// within 20s: a client that vanished (a host that died without a reset)
// or went silent frees its slot within 80s rather than gRPC's two hours
// and 20s.
const (
	keepaliveTime    = time.Minute
	keepaliveTimeout = 20 * time.Second
	// keepaliveMinPing is the shortest ping interval a client may use
	// (gRPC's default is 5 minutes, which Envoy's keepalive settings often
	// undercut); a client that pings more often is sent away.
	keepaliveMinPing = 10 * time.Second
)

// connOptions are the options of both gRPC servers (client and peer
// ports) that bound what a connection holds: its handshakes (TLS and
// HTTP/2) within HandshakeTimeout, else it is closed (gRPC's default is
// 120s); a connection without RPCs closed after IdleTimeout; keepalive as
// above.
func (c Config) connOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(c.HandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: c.IdleTimeout, Time: keepaliveTime, Timeout: keepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinPing, PermitWithoutStream: true}),
	}
}

// clientTap is the client port's grpc.InTapHandle. The RPC establishes its
// connection (package conns), the gate admits it (admit.Gate.Tap), and
// then a stream of the methods newClientTap is given gets a context its
// server can end (mux.Stoppable), so that a stream that does not read or
// send gives its slot back though blocked; and a unary RPC gets a deadline
// of RequestTimeout unless its client gave a shorter one, so that a client
// withholding its message cannot hold a slot of --max-inflight. Only
// admitted RPCs get either: gRPC never ends a refused RPC's context until
// its connection closes. See docs/design-ports.md, "Connections and
// streams earn their slots".
type clientTap struct {
	gate           *admit.Gate
	lis            *conns.Listener // its RPCs' connections are established
	requestTimeout time.Duration
	streams        map[string]bool
	// unary holds the full names of the unary methods, once learn has
	// read them from the server; it is written before the server serves,
	// and only read after.
	unary map[string]bool
}

func newClientTap(gate *admit.Gate, lis *conns.Listener, requestTimeout time.Duration, streams ...string) *clientTap {
	t := &clientTap{gate: gate, lis: lis, requestTimeout: requestTimeout, streams: map[string]bool{}, unary: map[string]bool{}}
	for _, m := range streams {
		t.streams[m] = true
	}
	return t
}

// learn reads the unary methods of srv, once every service is registered
// and before it serves.
func (t *clientTap) learn(srv *grpc.Server) {
	for svc, info := range srv.GetServiceInfo() {
		for _, m := range info.Methods {
			if !m.IsClientStream && !m.IsServerStream {
				t.unary["/"+svc+"/"+m.Name] = true
			}
		}
	}
}

func (t *clientTap) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	establish(ctx, t.lis)
	ctx, err := t.gate.Tap(ctx, info)
	switch {
	case err != nil:
	case t.streams[info.FullMethodName]:
		ctx = mux.Stoppable(ctx)
	case t.unary[info.FullMethodName]:
		if d, ok := ctx.Deadline(); !ok || time.Until(d) > t.requestTimeout {
			// The timer is released when the RPC ends, which ends ctx's
			// parent; AfterFunc says so to vet.
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, t.requestTimeout)
			context.AfterFunc(ctx, cancel)
		}
	}
	return ctx, err
}

// establishing is the peer server's tap (peer.ServerOptions): an RPC establishes
// its connection (see package conns).
func establishing(lis *conns.Listener) tap.ServerInHandle {
	return func(ctx context.Context, _ *tap.Info) (context.Context, error) {
		establish(ctx, lis)
		return ctx, nil
	}
}

// establish tells lis that the connection of the RPC of ctx has made a
// request.
func establish(ctx context.Context, lis *conns.Listener) {
	if p, ok := peer.FromContext(ctx); ok {
		lis.Established(p.Addr)
	}
}

// streamsEnded counts the long-lived streams a node ends for holding
// their slot without earning it (see mux.Server.Ended), by stream and
// reason.
type streamsEnded struct{ vec *prometheus.CounterVec }

func newStreamsEnded(reg prometheus.Registerer) streamsEnded {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringlimit_streams_ended_total",
		Help: "Long-lived streams the node ended, by stream (check: CheckStream; forward: a peer's ForwardStream; rlqs: an Envoy's quota stream) and reason: not_read (an answer waited --stream-send-timeout for its client to read it; the client's connection is closed) or idle (no request for --stream-idle-timeout; a CheckStream's or ForwardStream's client is asked to end it halfway).",
	}, []string{"stream", "reason"})
	reg.MustRegister(vec)
	return streamsEnded{vec}
}

// of returns what a node does when it ends a stream of the kind stream,
// served on lis: it counts it, and closes the connection of a client
// that did not read its answers. That client reads nothing of the
// connection, or nothing of that stream, and the stream's unsent answers
// (up to gRPC's 64 KiB a stream, and one answer more) would wait there
// until it did: closing the connection frees them, and the slots of the
// connection and of its other streams.
func (e streamsEnded) of(stream string, lis *conns.Listener) func(ctx context.Context, reason error) {
	notRead, idle := e.vec.WithLabelValues(stream, "not_read"), e.vec.WithLabelValues(stream, "idle")
	return func(ctx context.Context, reason error) {
		if !errors.Is(reason, mux.ErrNotRead) {
			idle.Inc()
			return
		}
		notRead.Inc()
		if p, ok := peer.FromContext(ctx); ok {
			lis.CloseConn(p.Addr)
		}
	}
}
