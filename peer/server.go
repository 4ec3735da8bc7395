package peer

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/mux"
	"github.com/ringlimit/ringlimit/internal/peerpb"
)

// The bounds of what crosses the peer port. They hold whatever a peer
// sends, so that a crafted message costs no more than a public request.
// A forwarded request carries at most checks.MaxItems items, as a
// client's may, so that forwarding cannot carry more than a client could
// send; a HandOff or Replicate RPC at most peerpb.MaxHandOffCounters
// counters of peerpb.MaxHandOffBytes, the batches hand-off and
// replication send; a sender's name is at most peerpb.MaxNodeNameLen
// bytes.
const (
	// MaxForwardItems bounds a Forward RPC: Server refuses a ForwardRequest
	// holding more requests, or more check items in all, than this. It is
	// the largest Config.BatchLimit (--batch-limit); a batch closes at
	// BatchLimit items, so a batch never holds more.
	MaxForwardItems = 10_000
	// MaxForwardBytes is the encoded size at which the batcher closes a
	// batch, whatever BatchLimit says. A batch holds at most this plus one
	// request (checks.MaxItems valid items of at most ~1.4 KB each, so
	// ~1.4 MB), well under MaxMessageBytes.
	MaxForwardBytes = 2 << 20
	// MaxMessageBytes is the peer server's receive limit (ServerOptions)
	// and the Pool's send limit: the largest Forward (MaxForwardBytes plus
	// one request) and the largest HandOff (peerpb.MaxHandOffBytes plus
	// framing) with room to spare. It is gRPC's default receive limit, made explicit
	// so that both ends agree on it.
	MaxMessageBytes = 4 << 20
)

// ServerOptions are the gRPC server options the peer listener needs: its
// receive limit, MaxMessageBytes, and a codec that decodes forwarded
// checks without reflection (wire.Codec) and counts every request before
// it decodes it (codec): no bounded field is built beyond one past its
// bound, and the requests not yet answered hold at most MaxInflightBytes
// on each server. Add them first to the *grpc.Server that serves Register:
// they include the outermost unary interceptor, which gives a request's
// bytes back when its call ends, and the server's grpc.InTapHandle, which
// gives each ForwardStream a context Server can end (see
// Server.BoundStreams). The taps given are called first, in order, for
// every RPC: gRPC takes one InTapHandle.
func ServerOptions(taps ...tap.ServerInHandle) []grpc.ServerOption {
	c := codec{budget: semaphore.NewWeighted(MaxInflightBytes)}
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.ForceServerCodecV2(c), grpc.ChainUnaryInterceptor(releaseUnary),
		grpc.InTapHandle(func(ctx context.Context, info *tap.Info) (context.Context, error) {
			for _, t := range taps {
				var err error
				if ctx, err = t(ctx, info); err != nil {
					return ctx, err
				}
			}
			return stoppableStreams(ctx, info)
		})}
}

// forwardStreamMethods are ForwardStream's full names, under the service's
// name and LegacyServiceName (see Register).
var forwardStreamMethods = map[string]bool{
	"/" + serviceName + "/ForwardStream":       true,
	"/" + LegacyServiceName + "/ForwardStream": true,
}

// stoppableStreams is the peer server's grpc.InTapHandle: it makes the
// context of each ForwardStream one its mux.Server can end.
func stoppableStreams(ctx context.Context, info *tap.Info) (context.Context, error) {
	if forwardStreamMethods[info.FullMethodName] {
		ctx = mux.Stoppable(ctx)
	}
	return ctx, nil
}

// Handler is what Server needs from the node: the owner's side of each peer
// RPC. Server calls it from gRPC's goroutines, concurrently, so
// implementations must be safe for concurrent use. Handlers must treat their
// arguments as read-only. Server has checked the bounds of each request
// (item and counter counts, a sender's name that is not empty, not too
// long, without NUL) before it calls the Handler; the Handler validates the
// content.
type Handler interface {
	// Forwarded decides reqs as their owner and returns one response per
	// request, in the same order.
	Forwarded(ctx context.Context, reqs []*pb.CheckRequest) []*pb.CheckResponse
	// Relayed is Forwarded for checks another node passed on (see
	// Pool.Relay): it must decide them here, never pass them on again.
	Relayed(ctx context.Context, reqs []*pb.CheckRequest) []*pb.CheckResponse
	// Pulled decides checks whose new owner asks this node, their previous
	// owner, to decide them on the counters it may still hold (see
	// Pool.Pull); it returns ErrNotHere, and decides nothing, if it does
	// not hold them all.
	Pulled(ctx context.Context, reqs []*pb.CheckRequest) ([]*pb.CheckResponse, error)
	// AddGlobalHits takes node from's reports of the GLOBAL counters it
	// tracks: hits admitted, grants wanted or released. It returns an
	// error, and takes nothing, when it refuses the request because of its
	// sender (not a member of the cluster); Server answers that with
	// codes.PermissionDenied.
	AddGlobalHits(ctx context.Context, from string, reports []*peerpb.GlobalReport) error
	// UpdateGlobals applies owner from's view of GLOBAL counters. It
	// returns an error, and applies nothing, when it refuses the request
	// because of its sender, as AddGlobalHits does.
	UpdateGlobals(ctx context.Context, from string, states []*peerpb.GlobalState) error
	// HandOff takes over counters that node from no longer owns and returns
	// one Refusal, naming the counter by its index in counters, for each it
	// did not take; every other counter was taken.
	HandOff(ctx context.Context, from string, counters []*peerpb.CounterState) []*peerpb.Refusal
	// HandOffDone takes node from's word that it has handed this node
	// every counter it held for keys this node owns in the ring whose ID
	// is ring (see HandOffRequest.done). Server calls it after HandOff, for
	// a request that carries both.
	HandOffDone(ctx context.Context, from string, ring uint64)
	// Left takes node from's last word as it shuts down: it has left the
	// cluster and will decide none of the keys this node owns in the ring
	// whose ID is ring (see HandOffRequest.left). Server calls it after
	// HandOffDone. It returns an error when it cannot take the word (yet);
	// Server answers that with codes.FailedPrecondition.
	Left(ctx context.Context, from string, ring uint64) error
	// Replicate keeps copies of counters that node from owns, to take over
	// should from crash, and returns one Refusal, naming the counter by
	// its index in counters, for each it did not keep.
	Replicate(ctx context.Context, from string, counters []*peerpb.CounterState) []*peerpb.Refusal
}

// Server is the gRPC Peer service. It checks the bounds of each RPC,
// refusing (and counting) what no honest peer sends, and delegates the
// rest to its Handler. Server is safe for concurrent use.
type Server struct {
	peerpb.UnimplementedPeerServer
	h       Handler
	refused *prometheus.CounterVec
	streams mux.Server[peerpb.ForwardStreamRequest, peerpb.ForwardStreamResponse]
}

// NewServer returns a Server that delegates to h. Its metric,
// ringlimit_peer_refused_rpcs_total, goes to reg; nil registers none. It
// panics if reg refuses the metric.
func NewServer(h Handler, reg prometheus.Registerer) *Server {
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringlimit_peer_refused_rpcs_total",
		Help: "Peer RPCs refused whole, before any of their content was used, by rpc (forward, global_report, global_state, handoff, replicate, lease) and reason.",
	}, []string{"rpc", "reason"})
	if reg != nil {
		reg.MustRegister(refused)
	}
	s := &Server{h: h, refused: refused}
	s.streams = mux.Server[peerpb.ForwardStreamRequest, peerpb.ForwardStreamResponse]{Timeout: forwardTimeout, Handle: s.forwardMessage, Notice: drainNotice}
	return s
}

// StreamBounds end a ForwardStream that holds its slot without earning it
// (see mux.Server's fields of the same names): one whose answer has
// waited SendTimeout for its sender to read it (gRPC's flow control then
// blocks the send), and one without a batch for IdleTimeout, which is
// asked to end halfway (the Pool's streams do at once, and send their
// next batches as Forward RPCs for mux.RetryAfter, then on a new stream).
// Ended, if not nil, is told of each
// stream so ended. Zero timeouts mean never.
type StreamBounds struct {
	SendTimeout, IdleTimeout time.Duration
	Ended                    func(ctx context.Context, reason error)
}

// BoundStreams bounds s's ForwardStreams, which are not bounded until it
// is called. Call it before s serves; the server must be built with
// ServerOptions, whose tap lets a stream whose send is blocked be ended.
func (s *Server) BoundStreams(b StreamBounds) {
	s.streams.SendTimeout, s.streams.IdleTimeout, s.streams.Ended = b.SendTimeout, b.IdleTimeout, b.Ended
}

// Register registers s as the Peer service on g (usually a *grpc.Server
// listening on the peer address only, never the public one, built with
// ServerOptions), under its name and under LegacyServiceName, which nodes
// of the previous version call.
func (s *Server) Register(g grpc.ServiceRegistrar) {
	peerpb.RegisterPeerServer(g, s)
	g.RegisterService(legacyDesc(), s)
}

// refuse counts a refused RPC and returns its error.
func (s *Server) refuse(rpc, reason string, code codes.Code, format string, args ...any) error {
	s.refused.WithLabelValues(rpc, reason).Inc()
	return status.Errorf(code, format, args...)
}

// Forward decides a batch of forwarded checks. It refuses, with
// codes.InvalidArgument, a batch of more than MaxForwardItems requests or
// items, or holding a request of more than checks.MaxItems items; and
// reports a Handler that does not answer every request with codes.Internal.
func (s *Server) Forward(ctx context.Context, req *peerpb.ForwardRequest) (*peerpb.ForwardResponse, error) {
	resps, err := s.forward(ctx, req.GetRequests(), req.GetPulled(), req.GetRelayed())
	if err != nil {
		return nil, err
	}
	return &peerpb.ForwardResponse{Responses: resps}, nil
}

// ForwardStream decides the batches of a stream of forwards (see
// mux.Serve), each as Forward decides one that is neither relayed nor
// pulled; a batch Forward would refuse is answered with its status, and
// the stream goes on. The sender must name itself in the stream's
// SenderHeader (Guard.Stream checks who it is).
func (s *Server) ForwardStream(stream peerpb.Peer_ForwardStreamServer) error {
	if err := s.checkSender("forward", Sender(stream.Context())); err != nil {
		return err
	}
	return s.streams.Serve(stream)
}

// Drain asks the sender of every ForwardStream to end it, answering what
// it sent until then: a node that stops does so before it stops its peer
// server, which waits for every stream to end. The Pool then sends its
// batches in Forward RPCs.
func (s *Server) Drain() { s.streams.Drain() }

// forwardMessage answers one batch of a ForwardStream.
func (s *Server) forwardMessage(ctx context.Context, req *peerpb.ForwardStreamRequest) *peerpb.ForwardStreamResponse {
	defer release(req) // the codec's budget, held since it decoded req
	resps, err := s.forward(ctx, req.GetRequests(), false, false)
	return &peerpb.ForwardStreamResponse{Id: req.GetId(), Responses: resps, Status: mux.Status(err)}
}

// drainNotice asks a sender to end its ForwardStream, for reason.
func drainNotice(reason error) *peerpb.ForwardStreamResponse {
	return &peerpb.ForwardStreamResponse{Status: mux.Status(reason)}
}

func forwardTimeout(req *peerpb.ForwardStreamRequest) time.Duration {
	return time.Duration(req.GetTimeoutMs()) * time.Millisecond
}

// forward checks the bounds of a batch of forwarded requests and has the
// Handler decide them, as Forward describes.
func (s *Server) forward(ctx context.Context, reqs []*pb.CheckRequest, pulled, relayed bool) ([]*pb.CheckResponse, error) {
	if len(reqs) > MaxForwardItems {
		return nil, s.refuse("forward", "too_many_requests", codes.InvalidArgument, "requests: a forward of %d requests, more than %d", len(reqs), MaxForwardItems)
	}
	items := 0
	for i, r := range reqs {
		n := len(r.GetRequests())
		if n > checks.MaxItems {
			return nil, s.refuse("forward", "too_many_items", codes.InvalidArgument, "requests[%d].requests: %d items, more than %d", i, n, checks.MaxItems)
		}
		items += n
	}
	if items > MaxForwardItems {
		return nil, s.refuse("forward", "too_many_items", codes.InvalidArgument, "requests: a forward of %d items, more than %d", items, MaxForwardItems)
	}
	var resps []*pb.CheckResponse
	switch {
	case pulled:
		var err error
		if resps, err = s.h.Pulled(ctx, reqs); err != nil {
			return nil, status.Error(codes.NotFound, err.Error())
		}
	case relayed:
		resps = s.h.Relayed(ctx, reqs)
	default:
		resps = s.h.Forwarded(ctx, reqs)
	}
	if len(resps) != len(reqs) {
		return nil, status.Errorf(codes.Internal, "handler answered %d of %d forwarded requests", len(resps), len(reqs))
	}
	for i, r := range resps {
		if r == nil {
			return nil, status.Errorf(codes.Internal, "handler answered forwarded request %d with nil", i)
		}
	}
	return resps, nil
}

// AddGlobalHits passes hits for GLOBAL keys to the Handler, unless the
// sender's name is malformed (codes.InvalidArgument) or the Handler
// refuses the sender (codes.PermissionDenied).
func (s *Server) AddGlobalHits(ctx context.Context, req *peerpb.GlobalHitsRequest) (*peerpb.GlobalHitsResponse, error) {
	if err := s.checkSender("global_report", req.GetFrom()); err != nil {
		return nil, err
	}
	if err := s.h.AddGlobalHits(ctx, req.GetFrom(), req.GetReports()); err != nil {
		return nil, s.refuse("global_report", "unknown_sender", codes.PermissionDenied, "%v", err)
	}
	return &peerpb.GlobalHitsResponse{}, nil
}

// UpdateGlobals passes the owner's GLOBAL states to the Handler, refusing
// them as AddGlobalHits refuses reports.
func (s *Server) UpdateGlobals(ctx context.Context, req *peerpb.GlobalUpdateRequest) (*peerpb.GlobalUpdateResponse, error) {
	if err := s.checkSender("global_state", req.GetFrom()); err != nil {
		return nil, err
	}
	if err := s.h.UpdateGlobals(ctx, req.GetFrom(), req.GetStates()); err != nil {
		return nil, s.refuse("global_state", "unknown_sender", codes.PermissionDenied, "%v", err)
	}
	return &peerpb.GlobalUpdateResponse{}, nil
}

// HandOff passes handed-off counters to the Handler and reports which it
// refused, and why, and how many it accepted; then the sender's word that
// it is done, if the request carries it, and its last word, if the
// request says it has left (codes.FailedPrecondition if the Handler does
// not take it). It refuses, with
// codes.InvalidArgument, a malformed sender's name and more than
// peerpb.MaxHandOffCounters counters, and reports a Handler that refuses a counter
// it was not given with codes.Internal.
func (s *Server) HandOff(ctx context.Context, req *peerpb.HandOffRequest) (*peerpb.HandOffResponse, error) {
	counters := req.GetCounters()
	refused, err := s.takeCounters(ctx, "handoff", req.GetFrom(), counters, s.h.HandOff)
	if err != nil {
		return nil, err
	}
	if done := req.GetDone(); done != 0 {
		s.h.HandOffDone(ctx, req.GetFrom(), done)
		if req.GetLeft() {
			if err := s.h.Left(ctx, req.GetFrom(), done); err != nil {
				return nil, status.Errorf(codes.FailedPrecondition, "left: %v", err) // not yet, as a rule: not counted as refused
			}
		}
	}
	return &peerpb.HandOffResponse{Accepted: int64(len(counters) - len(refused)), Refused: refused}, nil
}

// Replicate passes replicated counters to the Handler and reports which
// it refused. It refuses the RPC as HandOff does: a malformed sender's
// name, more than peerpb.MaxHandOffCounters counters, and a Handler that refuses
// a counter it was not given (codes.Internal).
func (s *Server) Replicate(ctx context.Context, req *peerpb.ReplicateRequest) (*peerpb.ReplicateResponse, error) {
	counters := req.GetCounters()
	refused, err := s.takeCounters(ctx, "replicate", req.GetFrom(), counters, s.h.Replicate)
	if err != nil {
		return nil, err
	}
	return &peerpb.ReplicateResponse{Accepted: int64(len(counters) - len(refused)), Refused: refused}, nil
}

// takeCounters is the part HandOff and Replicate (rpc) share: it checks
// the sender's name and the number of counters, passes them (if any) to
// handle, and checks that the refusals name distinct counters of those
// given.
func (s *Server) takeCounters(ctx context.Context, rpc, from string, counters []*peerpb.CounterState,
	handle func(ctx context.Context, from string, counters []*peerpb.CounterState) []*peerpb.Refusal) ([]*peerpb.Refusal, error) {
	if err := s.checkSender(rpc, from); err != nil {
		return nil, err
	}
	if len(counters) > peerpb.MaxHandOffCounters {
		return nil, s.refuse(rpc, "too_many_counters", codes.InvalidArgument, "counters: %d, more than %d", len(counters), peerpb.MaxHandOffCounters)
	}
	if len(counters) == 0 {
		return nil, nil
	}
	refused := handle(ctx, from, counters)
	if err := checkRefusals(refused, len(counters)); err != nil {
		return nil, status.Errorf(codes.Internal, "handler %v", err)
	}
	return refused, nil
}

// checkSender refuses a sender's name that no node has: empty, longer than
// peerpb.MaxNodeNameLen or holding a NUL byte.
func (s *Server) checkSender(rpc, from string) error {
	switch {
	case from == "":
		return s.refuse(rpc, "bad_sender", codes.InvalidArgument, "from: must name the sending node")
	case len(from) > peerpb.MaxNodeNameLen:
		return s.refuse(rpc, "bad_sender", codes.InvalidArgument, "from: longer than %d bytes", peerpb.MaxNodeNameLen)
	case strings.IndexByte(from, 0) >= 0:
		return s.refuse(rpc, "bad_sender", codes.InvalidArgument, "from: must not contain a NUL byte")
	}
	return nil
}

// checkRefusals reports refusals that do not name distinct counters among
// n, which would make "every counter not refused was accepted" a lie.
func checkRefusals(refused []*peerpb.Refusal, n int) error {
	seen := make(map[int32]bool, len(refused))
	for _, r := range refused {
		i := r.GetIndex()
		if i < 0 || int(i) >= n || seen[i] {
			return fmt.Errorf("refused counter %d of %d (a duplicate or out of range)", i, n)
		}
		seen[i] = true
	}
	return nil
}
