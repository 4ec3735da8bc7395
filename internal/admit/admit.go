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
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
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
	// Registerer, if not nil, gets ringlimit_overload_rejected_total.
	Registerer prometheus.Registerer
}

// Gate admits up to Max requests at once across the interfaces it wraps,
// and refuses the others at once. It is safe for concurrent use.
type Gate struct {
	slots    chan struct{}
	streams  chan struct{} // one per Streams call open
	long     map[string]bool
	refused  *prometheus.CounterVec
	overload *status.Status // what Tap refuses with
}

// New returns a Gate.
func New(conf Config) *Gate {
	if conf.MaxStreams <= 0 {
		conf.MaxStreams = DefaultMaxStreams
	}
	g := &Gate{
		slots:   make(chan struct{}, conf.Max),
		streams: make(chan struct{}, conf.MaxStreams),
		long:    map[string]bool{},
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_overload_rejected_total",
			Help: "Requests refused at once because the node had --max-inflight requests in flight (or --max-streams streams open), by interface (grpc, grpc_stream, http).",
		}, []string{"interface"}),
	}
	for _, m := range conf.Streams {
		g.long[m] = true
	}
	// RetryInfo is gRPC's Retry-After, as grpclimit sends it.
	st, err := status.New(codes.ResourceExhausted, "overloaded: too many requests in flight, retry later").
		WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
	if err != nil {
		panic(err) // RetryInfo always marshals
	}
	g.overload = st
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

// HTTP wraps h: a request beyond the bound gets 503 with Retry-After: 1 and
// a JSON error, without h being called.
func (g *Gate) HTTP(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.enter(g.slots, "http") {
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":"overloaded: too many requests in flight, retry later"}` + "\n"))
			return
		}
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
// beyond MaxStreams; its requests take slots through Message.
func (g *Gate) Tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if strings.HasPrefix(info.FullMethodName, "/grpc.health.v1.Health/") {
		return ctx, nil
	}
	slots, leave := g.slots, g.leave
	if g.long[info.FullMethodName] {
		slots, leave = g.streams, g.endStream
	}
	if !g.enter(slots, "grpc") {
		return ctx, g.overload.Err()
	}
	context.AfterFunc(ctx, leave)
	return ctx, nil
}

// Message takes a slot for one request of a Config.Streams call, and
// returns the function that gives it back once the request is answered;
// beyond the bound it returns the error Tap refuses calls with, counted
// on interface grpc_stream.
func (g *Gate) Message() (done func(), err error) {
	if !g.enter(g.slots, "grpc_stream") {
		return nil, g.overload.Err()
	}
	return g.leave, nil
}
