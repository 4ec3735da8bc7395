package rls_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/api"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/policy"
	"github.com/ringlimit/ringlimit/rls"
	"github.com/ringlimit/ringlimit/service"
)

// BenchmarkRLSVersusNative measures one check of one descriptor through
// Envoy's protocol against the native check the RLS makes of it (the same
// counter, the same fixed window that counts refusals), both over real
// gRPC on loopback to one server (grpc/...), and in process without a
// transport (inprocess/...), in the same run. The difference is the RLS's
// own work: policy matching, key building and translation.
func BenchmarkRLSVersusNative(b *testing.B) {
	path := filepath.Join(b.TempDir(), "p.yaml")
	yaml := "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		b.Fatal(err)
	}
	policies, err := policy.NewReloader(policy.ReloaderConfig{Path: path})
	if err != nil {
		b.Fatal(err)
	}
	svc := service.New(service.Config{})
	srv := grpc.NewServer()
	api.New(api.Config{Checker: svc}).RegisterGRPC(srv)
	rls.New(rls.Config{Checker: svc, Policies: policies}).Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	const keys = 1024
	rlsReqs := make([]*rlspb.RateLimitRequest, keys)
	nativeReqs := make([]*pb.CheckRequest, keys)
	one := int64(1)
	for i := range keys {
		ip := fmt.Sprintf("10.0.%d.%d", i/256, i%256)
		rlsReqs[i] = &rlspb.RateLimitRequest{Domain: "edge", Descriptors: ds(desc("remote_address", ip))}
		nativeReqs[i] = &pb.CheckRequest{Requests: []*pb.CheckItem{{Name: "rls/SECOND", Key: "edge_remote_address_" + ip + "_",
			Hits: &one, Limit: 1_000_000_000, DurationMs: 1000, Algorithm: pb.Algorithm_FIXED_WINDOW, ChargeRefused: true}}}
	}
	rlsSrv := rls.New(rls.Config{Checker: svc, Policies: policies})
	type rlsCall = func(context.Context, *rlspb.RateLimitRequest, ...grpc.CallOption) (*rlspb.RateLimitResponse, error)
	type nativeCall = func(context.Context, *pb.CheckRequest, ...grpc.CallOption) (*pb.CheckResponse, error)
	benchRLS := func(call rlsCall) func(b *testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				resp, err := call(b.Context(), rlsReqs[i%keys])
				if err != nil || resp.OverallCode != rlspb.RateLimitResponse_OK {
					b.Fatal(resp, err)
				}
				i++
			}
		}
	}
	benchNative := func(call nativeCall) func(b *testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				resp, err := call(b.Context(), nativeReqs[i%keys])
				if err != nil || resp.Responses[0].Status != pb.Status_UNDER_LIMIT {
					b.Fatal(resp, err)
				}
				i++
			}
		}
	}
	b.Run("grpc/rls", benchRLS(rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit))
	b.Run("grpc/native", benchNative(pb.NewRateLimiterClient(conn).Check))
	b.Run("inprocess/rls", benchRLS(func(ctx context.Context, r *rlspb.RateLimitRequest, _ ...grpc.CallOption) (*rlspb.RateLimitResponse, error) {
		return rlsSrv.ShouldRateLimit(ctx, r)
	}))
	b.Run("inprocess/native", benchNative(func(ctx context.Context, r *pb.CheckRequest, _ ...grpc.CallOption) (*pb.CheckResponse, error) {
		return svc.Check(ctx, r)
	}))
}
