package peer

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/peerpb"
)

// SettleHandler is the owner's side of Peer/Settle: a Handler that also
// implements it settles reservations another node relayed; Server answers
// codes.Unimplemented for a Handler that does not.
type SettleHandler interface {
	// Settle settles req, which node from relayed, on this node's own
	// reservations, never passing it on. Its error is the public
	// Settle's, mapped by checks.Code.
	Settle(ctx context.Context, from string, req *pb.SettleRequest) (*pb.SettleResponse, error)
}

// Settle relays a client's settle, sent to node from, to the node at
// addr, which it takes for the key's owner. Its error carries the
// owner's status code, or wraps ErrUnreachable.
func (p *Pool) Settle(ctx context.Context, addr, from string, req *pb.SettleRequest) (*pb.SettleResponse, error) {
	return unary(ctx, p, "settle", addr, peerpb.PeerClient.Settle, &peerpb.SettleRelayRequest{From: from, Settle: req})
}

// Settle passes a relayed settle to the Handler. It refuses a malformed
// sender's name with codes.InvalidArgument, and answers the Handler's
// error with its code (checks.Code).
func (s *Server) Settle(ctx context.Context, req *peerpb.SettleRelayRequest) (*pb.SettleResponse, error) {
	if err := s.checkSender("settle", req.GetFrom()); err != nil {
		return nil, err
	}
	h, ok := s.h.(SettleHandler)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this node holds no reservations")
	}
	resp, err := h.Settle(ctx, req.GetFrom(), req.GetSettle())
	if err != nil {
		return nil, status.Error(checks.Code(err), err.Error())
	}
	return resp, nil
}
