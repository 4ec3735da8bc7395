package api

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/service"
)

// serveGRPC serves s's gRPC faces on loopback, on a grpc.Server of opts,
// until the test ends, and returns a connection to them.
func serveGRPC(t testing.TB, s *Server, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	s.RegisterGRPC(srv)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestGRPC(t *testing.T) {
	conn := serveGRPC(t, New(Config{Checker: service.New(service.Config{})}))
	ctx := context.Background()

	rl := pb.NewRateLimiterClient(conn)
	resp, err := rl.Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{{Name: "api", Key: "k", Limit: 1, DurationMs: 1000}}})
	if err != nil || resp.Responses[0].Status != pb.Status_UNDER_LIMIT {
		t.Fatalf("Check: %v %v", resp, err)
	}
	resp, _ = rl.Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{{Name: "api", Key: "k", Limit: 1, DurationMs: 1000}}})
	if resp.Responses[0].Status != pb.Status_OVER_LIMIT {
		t.Errorf("second check: %v, want OVER_LIMIT", resp.Responses[0].Status)
	}
	items := make([]*pb.CheckItem, checks.MaxItems+1)
	for i := range items {
		items[i] = &pb.CheckItem{}
	}
	if _, err := rl.Check(ctx, &pb.CheckRequest{Requests: items}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("too many items: %v, want InvalidArgument", err)
	}

	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health: %v %v", h, err)
	}
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
	r, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range r.GetListServicesResponse().GetService() {
		found = found || s.Name == "ringlimit.v1.RateLimiter"
	}
	if !found {
		t.Errorf("reflection does not list ringlimit.v1.RateLimiter: %v", r)
	}
}
