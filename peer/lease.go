package peer

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/peerpb"
)

// LeaseHandler is the owner's side of Peer/Lease: a Handler that also
// implements it takes lessees' reports another node relayed (see package
// lease); Server answers codes.Unimplemented for a Handler that does not.
type LeaseHandler interface {
	// Lease takes the reports node from relayed for the lessee whose
	// account id is lessee, and answers each, in order. It returns an
	// error, answered codes.InvalidArgument, for a request it refuses
	// whole.
	Lease(ctx context.Context, from string, lessee []byte, reports []*pb.LeaseReport) ([]*pb.LeaseGrant, error)
}

// Lease relays lessee's reports, which a client sent node from, to their
// keys' owner at addr, and returns its answers, one per report.
func (p *Pool) Lease(ctx context.Context, addr, from string, lessee []byte, reports []*pb.LeaseReport) ([]*pb.LeaseGrant, error) {
	resp, err := unary(ctx, p, "lease", addr, peerpb.PeerClient.Lease, &peerpb.LeaseRelayRequest{From: from, Lessee: lessee, Reports: reports})
	if err != nil {
		return nil, err
	}
	if n := len(resp.GetGrants()); n != len(reports) {
		return nil, fmt.Errorf("lease to %s: peer answered %d of %d reports", addr, n, len(reports))
	}
	return resp.GetGrants(), nil
}

// Lease passes relayed lessee reports to the Handler. It refuses, with
// codes.InvalidArgument, a malformed sender's name and more than
// checks.MaxItems reports (the codec decodes no more than one beyond
// it), and reports a Handler that does not answer every report with
// codes.Internal.
func (s *Server) Lease(ctx context.Context, req *peerpb.LeaseRelayRequest) (*peerpb.LeaseRelayResponse, error) {
	if err := s.checkSender("lease", req.GetFrom()); err != nil {
		return nil, err
	}
	h, ok := s.h.(LeaseHandler)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this node takes no lease reports")
	}
	reports := req.GetReports()
	if len(reports) > checks.MaxItems {
		return nil, s.refuse("lease", "too_many_items", codes.InvalidArgument, "reports: more than %d", checks.MaxItems)
	}
	grants, err := h.Lease(ctx, req.GetFrom(), req.GetLessee(), reports)
	if err != nil {
		return nil, s.refuse("lease", "invalid", codes.InvalidArgument, "%v", err)
	}
	if len(grants) != len(reports) {
		return nil, status.Errorf(codes.Internal, "handler answered %d of %d lease reports", len(grants), len(reports))
	}
	return &peerpb.LeaseRelayResponse{Grants: grants}, nil
}
