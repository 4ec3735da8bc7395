// Package grpclimit is gRPC server middleware that asks ringlimit whether
// each call may go ahead. A refused call fails with RESOURCE_EXHAUSTED and
// a google.rpc.RetryInfo detail saying when the same call would pass, the
// gRPC way of saying 429 and Retry-After:
//
//	l := &grpclimit.Limiter{Client: c, Limit: client.Limit{Name: "api", Count: 100, Period: time.Minute}}
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(l.Unary), grpc.ChainStreamInterceptor(l.Stream))
//
// A stream is one call: it is checked once, when it opens, and its
// messages are not counted. A call that asks for more than the limit can
// ever hold gets no RetryInfo, since no delay would help.
//
// When ringlimit cannot answer, the choices are those of httplimit: fail
// closed (UNAVAILABLE, the default), fail open (FailOpen), or decide with
// the error in hand (ErrorHandler).
package grpclimit

import (
	"context"
	"net"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ringlimit/ringlimit/client"
)

// Taker is what the interceptors need of ringlimit: *client.Client.
type Taker interface {
	Take(ctx context.Context, l client.Limit, key string, hits int64) (client.Decision, error)
}

// Limiter limits the calls to a gRPC server. Set the fields, then install
// Unary and Stream as interceptors; a Limiter must not be changed once it
// is serving, and is then safe for concurrent use.
type Limiter struct {
	// Client asks ringlimit; required.
	Client Taker
	// Limit is checked for every call, one hit each. Required.
	Limit client.Limit
	// Key returns the limited entity of a call to fullMethod (e.g.
	// "/pkg.Service/Method") with the incoming metadata md; nil means the
	// IP address of the peer (or its whole address when that is not IP,
	// as on a Unix socket). Key may return "" to exempt a call from the
	// limit.
	Key func(ctx context.Context, fullMethod string, md metadata.MD) string
	// Timeout bounds each check; zero means 100ms.
	Timeout time.Duration
	// FailOpen says what to do when ringlimit cannot answer (unreachable,
	// too slow, or the check is invalid): let the call through (true) or
	// fail it with UNAVAILABLE (false, the zero value). ErrorHandler, when
	// set, decides instead.
	FailOpen bool
	// ErrorHandler, when set, decides the calls whose check failed, with
	// the error: it returns nil to let the call through, or the error to
	// fail it with (a status error, for the client to see a code). Nil
	// means FailOpen's choice, with err dropped.
	ErrorHandler func(ctx context.Context, fullMethod string, err error) error
}

// Unary is a grpc.UnaryServerInterceptor that checks the limit before
// handler runs.
func (l *Limiter) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := l.admit(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// Stream is a grpc.StreamServerInterceptor that checks the limit once,
// before handler runs.
func (l *Limiter) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := l.admit(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

// admit returns nil if a call to method may go ahead, else the error to
// fail it with.
func (l *Limiter) admit(ctx context.Context, method string) error {
	key := peerKey(ctx)
	if l.Key != nil {
		md, _ := metadata.FromIncomingContext(ctx)
		key = l.Key(ctx, method, md)
		if key == "" {
			return nil
		}
	}
	timeout := l.Timeout
	if timeout <= 0 {
		timeout = 100 * time.Millisecond
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	d, err := l.Client.Take(tctx, l.Limit, key, 1)
	cancel()
	switch {
	case err != nil && l.ErrorHandler != nil:
		return l.ErrorHandler(ctx, method, err)
	case err != nil && l.FailOpen:
		return nil
	case err != nil:
		return status.Error(codes.Unavailable, "rate limiter unavailable")
	case d.Allowed:
		return nil
	}
	return refusal(l.Limit.Name, d)
}

// refusal is the RESOURCE_EXHAUSTED status of a refused call, with a
// RetryInfo detail unless no delay would help.
func refusal(name string, d client.Decision) error {
	msg := "rate limit " + name + " exceeded"
	if d.RetryAfter == client.Never {
		return status.Error(codes.ResourceExhausted, msg+": the call asks for more than the limit holds")
	}
	st, err := status.New(codes.ResourceExhausted, msg).WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)})
	if err != nil { // a RetryInfo always marshals; keep the code if it did not
		return status.Error(codes.ResourceExhausted, msg)
	}
	return st.Err()
}

// peerKey is the IP address of the call's peer, or its whole address when
// that has no IP; "" without a peer.
func peerKey(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
		return host
	}
	return p.Addr.String()
}
