// Package api holds ringlimit's faces: the ringlimit.v1 gRPC service, the
// HTTP/JSON interface and the operational endpoints. It only translates;
// package service decides.
package api

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// grpcServer is the ringlimit.v1.RateLimiter service.
type grpcServer struct {
	pb.UnimplementedRateLimiterServer
	s *Server
}

func (g grpcServer) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	defer g.s.observe("grpc", time.Now())
	g.s.tellStaleRing(ctx)
	resp, err := g.s.conf.Checker.Check(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	if by := decidedBy(resp); by != "" {
		grpc.SetTrailer(ctx, metadata.Pairs(DecidedByHeader, by))
	}
	return resp, nil
}

// RegisterGRPC registers the RateLimiter service, the standard health
// service and server reflection on srv. It returns the health server so
// that the caller can mark the node serving or not.
func (s *Server) RegisterGRPC(srv *grpc.Server) *health.Server {
	pb.RegisterRateLimiterServer(srv, grpcServer{s: s})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	reflection.Register(srv)
	return hs
}
