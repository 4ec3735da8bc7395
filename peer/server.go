package peer

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// MaxForwardItems bounds a Forward RPC: Server refuses a ForwardRequest
// holding more requests, or more check items in all, than this. Pool never
// sends more than Config.BatchLimit items in one RPC unless a single request
// holds more.
const MaxForwardItems = 10_000

// Handler is what Server needs from the node: the owner's side of each peer
// RPC. Server calls it from gRPC's goroutines, concurrently, so
// implementations must be safe for concurrent use. Handlers must treat their
// arguments as read-only.
type Handler interface {
	// Forwarded decides reqs as their owner and returns one response per
	// request, in the same order.
	Forwarded(ctx context.Context, reqs []*pb.CheckRequest) []*pb.CheckResponse
	// AddGlobalHits takes node from's reports of the GLOBAL counters it
	// tracks: hits admitted, grants wanted or released.
	AddGlobalHits(ctx context.Context, from string, reports []*pb.GlobalReport)
	// UpdateGlobals applies the owner's view of GLOBAL counters.
	UpdateGlobals(ctx context.Context, states []*pb.GlobalState)
	// HandOff takes over counters that node from no longer owns and returns
	// one Refusal, naming the counter by its index in counters, for each it
	// did not take; every other counter was taken.
	HandOff(ctx context.Context, from string, counters []*pb.CounterState) []*pb.Refusal
}

// Server is the gRPC Peer service. It checks the bounds of each RPC and
// delegates the rest to its Handler. Server holds no state of its own and is
// safe for concurrent use.
type Server struct {
	pb.UnimplementedPeerServer
	h Handler
}

// NewServer returns a Server that delegates to h.
func NewServer(h Handler) *Server {
	return &Server{h: h}
}

// Register registers s as the Peer service on g (usually a *grpc.Server
// listening on the peer address only, never the public one).
func (s *Server) Register(g grpc.ServiceRegistrar) {
	pb.RegisterPeerServer(g, s)
}

// Forward decides a batch of forwarded checks. It refuses a batch larger
// than MaxForwardItems with codes.InvalidArgument, and reports a Handler that
// does not answer every request with codes.Internal.
func (s *Server) Forward(ctx context.Context, req *pb.ForwardRequest) (*pb.ForwardResponse, error) {
	reqs := req.GetRequests()
	if len(reqs) > MaxForwardItems {
		return nil, status.Errorf(codes.InvalidArgument, "forward of %d requests, more than %d", len(reqs), MaxForwardItems)
	}
	items := 0
	for _, r := range reqs {
		items += len(r.GetRequests())
	}
	if items > MaxForwardItems {
		return nil, status.Errorf(codes.InvalidArgument, "forward of %d items, more than %d", items, MaxForwardItems)
	}
	resps := s.h.Forwarded(ctx, reqs)
	if len(resps) != len(reqs) {
		return nil, status.Errorf(codes.Internal, "handler answered %d of %d forwarded requests", len(resps), len(reqs))
	}
	for i, r := range resps {
		if r == nil {
			return nil, status.Errorf(codes.Internal, "handler answered forwarded request %d with nil", i)
		}
	}
	return &pb.ForwardResponse{Responses: resps}, nil
}

// AddGlobalHits passes hits for GLOBAL keys to the Handler.
func (s *Server) AddGlobalHits(ctx context.Context, req *pb.GlobalHitsRequest) (*pb.GlobalHitsResponse, error) {
	s.h.AddGlobalHits(ctx, req.GetFrom(), req.GetReports())
	return &pb.GlobalHitsResponse{}, nil
}

// UpdateGlobals passes the owner's GLOBAL states to the Handler.
func (s *Server) UpdateGlobals(ctx context.Context, req *pb.GlobalUpdateRequest) (*pb.GlobalUpdateResponse, error) {
	s.h.UpdateGlobals(ctx, req.GetStates())
	return &pb.GlobalUpdateResponse{}, nil
}

// HandOff passes handed-off counters to the Handler and reports which it
// refused, and why, and how many it accepted. It reports a Handler that
// refuses a counter it was not given with codes.Internal.
func (s *Server) HandOff(ctx context.Context, req *pb.HandOffRequest) (*pb.HandOffResponse, error) {
	counters := req.GetCounters()
	refused := s.h.HandOff(ctx, req.GetFrom(), counters)
	if err := checkRefusals(refused, len(counters)); err != nil {
		return nil, status.Errorf(codes.Internal, "handler %v", err)
	}
	return &pb.HandOffResponse{Accepted: int64(len(counters) - len(refused)), Refused: refused}, nil
}

// checkRefusals reports refusals that do not name distinct counters among
// n, which would make "every counter not refused was accepted" a lie.
func checkRefusals(refused []*pb.Refusal, n int) error {
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
