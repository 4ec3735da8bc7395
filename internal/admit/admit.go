// Package admit bounds the requests a node works on at once. A request
// beyond the bound is refused at once (HTTP 503 with Retry-After, gRPC
// RESOURCE_EXHAUSTED) rather than queued: under overload, a queue only
// adds latency and memory to every request, while a prompt refusal lets
// the client back off or try another node. The gRPC side refuses an RPC
// from its headers, before its message is read, so a refused request costs
// no memory for its body.
//
// A stream that carries requests as its messages (Config.Streams) would
// hold a slot for as long as it is open, idle or not: such streams are
// bounded by a count of their own (Config.MaxStreams), and each of their
// requests takes a slot while it is decided (Gate.Message).
package admit

import (
	"context"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// DefaultMax is the default bound on requests in flight. A check takes
// tens of microseconds and a forwarded one about a round trip, so a node
// at full speed has far fewer in flight; the bound is for floods.
const DefaultMax = 1024

// DefaultMaxStreams is the default bound on request streams open at once:
// a client process keeps one to each node it talks to, and a stream holds
// up to 4 decoded requests of up to 2 MiB (see package mux), so that 256
// hold at most what 1,024 requests in flight do (DefaultMax).
const DefaultMaxStreams = 256

// Config configures a Gate.
type Config struct {
	// Max is the most requests in flight at once; it must be positive.
	Max int
	// Streams are the full names of the gRPC methods whose calls are
	// long-lived streams of requests, such as
	// "/ringlimit.v1.RateLimiter/CheckStream": Tap admits at most
	// MaxStreams of them at once, without a request slot.
	Streams []string
	// MaxStreams bounds the Streams calls open at once; zero means
	// DefaultMaxStreams.
	MaxStreams int
	// Pools bounds, each by a count of its own, the calls of methods
	// whose long-lived streams are not streams of requests (Envoy's quota
	// streams, --rlqs-max-streams): Tap admits at most that many of each
	// method at once, without a request slot and without a slot of
	// MaxStreams, so that they cannot take the slots of the others.
	Pools map[string]int
	// MaxBytes bounds the bytes of the requests in flight, each accounted
	// at RequestBytes (HTTP) or CallBytes (gRPC); zero means no bound but
	// Max.
	MaxBytes int64
	// MaxBodyBytes is the largest HTTP body the wrapped handler reads,
	// what a body of unknown length is accounted at (see RequestBytes).
	MaxBodyBytes int64
	// CallBytes is what a gRPC call is accounted at until its message has
	// arrived (ArrivalBytes of the server's receive limit: what the call
	// may hold while it arrives); zero means DefaultCallBytes. A unary
	// call is then accounted at RequestBytes of its message's size (see
	// ServerOptions). A call of Config.Streams or Config.Pools is
	// accounted at DefaultCallBytes for as long as it is open, and each
	// request of a Streams call at RequestBytes of its size (Message).
	CallBytes int64
	// Registerer, if not nil, gets ringlimit_overload_rejected_total.
	Registerer prometheus.Registerer
}

// DefaultCallBytes is what a gRPC call is accounted at by default until
// its message has arrived, and a long-lived stream while it is open: a
// check of a hundred items, decoded and answered.
const DefaultCallBytes = 64 << 10

// ArrivalBytes is what a gRPC call whose message may be up to maxMessage
// bytes long is accounted at until the message has arrived (Config.CallBytes):
// the message's bytes, which gRPC holds as they arrive, and what any
// request holds besides.
func ArrivalBytes(maxMessage int64) int64 { return maxMessage + requestFixed }

// The terms of RequestBytes, measured with api's maximal bodies (see
// TestRequestBytes in package api): decoding a check body into its
// messages, the store's requests and the results, and writing the
// answer, costs up to about three times the body, and any request its
// buffers and goroutine.
const (
	bodyFactor   = 4
	requestFixed = 32 << 10
)

// RequestBytes is what a request whose body (or gRPC message) is n bytes
// long (-1: unknown, read to at most maxBody) is accounted at.
func RequestBytes(n, maxBody int64) int64 {
	if n < 0 || n > maxBody {
		n = maxBody
	}
	return n*bodyFactor + requestFixed
}

// budget is a bound on bytes in flight; the zero value holds nothing
// (max 0: no bound).
type budget struct {
	max  int64
	used atomic.Int64
}

// take accounts n more bytes, unless that would go beyond the bound.
func (b *budget) take(n int64) bool {
	if b.max == 0 {
		return true
	}
	for {
		used := b.used.Load()
		if used+n > b.max {
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

// give gives back n bytes taken.
func (b *budget) give(n int64) {
	if b.max != 0 {
		b.used.Add(-n)
	}
}

// Gate admits up to Max requests at once across the interfaces it wraps,
// and refuses the others at once. It is safe for concurrent use.
type Gate struct {
	slots     chan struct{}
	streams   chan struct{} // one per Streams call open
	long      map[string]bool
	pools     map[string]chan struct{} // one per Pools call open, by method
	refused   *prometheus.CounterVec
	overload  *status.Status // what Tap refuses with
	bytes     budget
	maxBody   int64
	callBytes int64
	memory    *status.Status // what Tap refuses with for bytes
}

// New returns a Gate.
func New(conf Config) *Gate {
	if conf.MaxStreams <= 0 {
		conf.MaxStreams = DefaultMaxStreams
	}
	if conf.CallBytes <= 0 {
		conf.CallBytes = DefaultCallBytes
	}
	if conf.MaxBytes < 0 {
		conf.MaxBytes = 0
	}
	g := &Gate{
		slots:   make(chan struct{}, conf.Max),
		streams: make(chan struct{}, conf.MaxStreams),
		long:    map[string]bool{},
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_overload_rejected_total",
			Help: "Requests refused at once because the node had --max-inflight requests in flight (or --max-streams streams open), or their share of --memory-limit, by interface (grpc, grpc_stream, http).",
		}, []string{"interface"}),
		bytes:     budget{max: conf.MaxBytes},
		maxBody:   conf.MaxBodyBytes,
		callBytes: conf.CallBytes,
	}
	for _, m := range conf.Streams {
		g.long[m] = true
	}
	g.pools = make(map[string]chan struct{}, len(conf.Pools))
	for m, n := range conf.Pools {
		if n < 1 {
			n = 1
		}
		g.pools[m] = make(chan struct{}, n)
	}
	// RetryInfo is gRPC's Retry-After, as grpclimit sends it.
	st, err := status.New(codes.ResourceExhausted, "overloaded: too many requests in flight, retry later").
		WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
	if err != nil {
		panic(err) // RetryInfo always marshals
	}
	g.overload = st
	g.memory = status.New(codes.ResourceExhausted, memoryMessage)
	if mst, err := g.memory.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)}); err == nil {
		g.memory = mst
	}
	if conf.Registerer != nil {
		conf.Registerer.MustRegister(g.refused)
	}
	return g
}

// enter takes a slot of slots if one is free, else counts a refusal on
// iface.
func (g *Gate) enter(slots chan struct{}, iface string) bool {
	select {
	case slots <- struct{}{}:
		return true
	default:
		g.refused.WithLabelValues(iface).Inc()
		return false
	}
}

func (g *Gate) leave()     { <-g.slots }
func (g *Gate) endStream() { <-g.streams }

// memoryMessage is the error of a request refused for bytes.
const memoryMessage = "overloaded: the requests in flight hold their share of --memory-limit, retry later"

// enterBytes takes a slot and n bytes, or neither, counting a refusal on
// iface; it returns the error to refuse with, nil when admitted.
func (g *Gate) enterBytes(slots chan struct{}, n int64, iface string) *status.Status {
	if !g.enter(slots, iface) {
		return g.overload
	}
	if !g.bytes.take(n) {
		<-slots
		g.refused.WithLabelValues(iface).Inc()
		return g.memory
	}
	return nil
}

// HTTP wraps h: a request beyond the bound, or beyond the bytes in flight
// (accounted at RequestBytes), gets 503 with Retry-After: 1 and a JSON
// error, without h being called.
func (g *Gate) HTTP(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := RequestBytes(r.ContentLength, g.maxBody)
		if st := g.enterBytes(g.slots, n, "http"); st != nil {
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":"` + st.Message() + `"}` + "\n"))
			return
		}
		defer g.bytes.give(n)
		defer g.leave()
		h.ServeHTTP(w, r)
	})
}

// Tap is a grpc.InTapHandle: an RPC beyond the bound is refused with
// RESOURCE_EXHAUSTED and a RetryInfo of a second, from its headers, before its message is read. The
// slot is given back when the RPC's context ends, which gRPC does when the
// RPC finishes (or the client cancels it). Health checks pass without a
// slot: a probe that failed under load would restart a busy node. A call
// of Config.Streams takes a stream slot instead, refused the same way
// beyond MaxStreams; its requests take slots through Message. A call of
// Config.Pools takes a slot of its method's pool.
func (g *Gate) Tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if strings.HasPrefix(info.FullMethodName, "/grpc.health.v1.Health/") {
		return ctx, nil
	}
	slots, leave, n := g.slots, g.leave, g.callBytes
	if g.long[info.FullMethodName] {
		slots, leave, n = g.streams, g.endStream, DefaultCallBytes
	} else if pool, ok := g.pools[info.FullMethodName]; ok {
		slots, leave, n = pool, func() { <-pool }, DefaultCallBytes
	}
	if st := g.enterBytes(slots, n, "grpc"); st != nil {
		return ctx, st.Err()
	}
	c := &call{unary: slots == g.slots}
	c.held.Store(n)
	context.AfterFunc(ctx, func() {
		g.bytes.give(c.held.Swap(ended))
		leave()
	})
	return context.WithValue(ctx, callKey{}, c), nil
}

// call is what the gate holds for one gRPC call Tap admitted, found in
// the call's context by the interceptor of ServerOptions.
type call struct {
	unary bool
	// held is the bytes the call holds of the budget; ended once the
	// call has ended and given them back.
	held atomic.Int64
}

type callKey struct{}

// ended is a call's held once it has given its bytes back.
const ended = -1

// resize makes c hold n bytes of the budget instead of what it holds, and
// reports whether the budget had room; a call that has ended holds
// nothing and is left so.
func (g *Gate) resize(c *call, n int64) bool {
	for {
		old := c.held.Load()
		switch {
		case old == ended:
			return true
		case n > old && !g.bytes.take(n-old):
			return false
		}
		if c.held.CompareAndSwap(old, n) {
			if n < old {
				g.bytes.give(old - n)
			}
			return true
		}
		if n > old {
			g.bytes.give(n - old) // lost the race: undo, and look again
		}
	}
}

// ServerOptions are the options of a grpc.Server whose calls Tap admits
// that account each unary call at its message's real size once it has
// arrived and been decoded (RequestBytes of its encoded size), instead of
// Config.CallBytes: an interceptor resizes the call's bytes, and refuses
// a call whose message does not fit with the same RESOURCE_EXHAUSTED as
// Tap, before its handler works on it.
func (g *Gate) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(g.unary)}
}

// unary is the interceptor of ServerOptions.
func (g *Gate) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c, ok := ctx.Value(callKey{}).(*call)
	if m, isProto := req.(proto.Message); ok && c.unary && isProto && !g.resize(c, RequestBytes(int64(proto.Size(m)), math.MaxInt64)) {
		g.refused.WithLabelValues("grpc").Inc()
		return nil, g.memory.Err()
	}
	return handler(ctx, req)
}

// Message takes a slot, and RequestBytes of its size, for one request of
// a Config.Streams call, size bytes long, and returns the function that
// gives them back once the request is answered; beyond the bound it
// returns the error Tap refuses calls with, counted on interface
// grpc_stream.
func (g *Gate) Message(size int64) (done func(), err error) {
	n := RequestBytes(size, math.MaxInt64)
	if st := g.enterBytes(g.slots, n, "grpc_stream"); st != nil {
		return nil, st.Err()
	}
	return func() {
		g.bytes.give(n)
		g.leave()
	}, nil
}
