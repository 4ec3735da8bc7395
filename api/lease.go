package api

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// Leaser is what the Lease RPC needs of the node: package lease's Node.
type Leaser interface {
	Lease(ctx context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error)
}

// Lease answers a lessee's call (see package lease). The codec of
// ServerOptions bounds its reports as it bounds a check's items; the
// admission gate (Config.Admit's Tap) admits it as any call.
func (g grpcServer) Lease(ctx context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	if g.s.conf.Leases == nil {
		return nil, status.Error(codes.Unimplemented, "this node lends no leases")
	}
	defer g.s.observe("grpc_lease", time.Now())
	resp, err := g.s.conf.Leases.Lease(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}
