package main

import (
	"context"
	"io"
	"strings"
	"testing"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/internal/admit"
)

// TestClientPortBoundsDescriptors checks that the client port decodes at
// most 1,001 descriptors of an Envoy rate limit request (api.ServerOptions
// with rls's bound), however many are sent.
func TestClientPortBoundsDescriptors(t *testing.T) {
	_, grpcAddr, _ := startNode(t)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := &rlspb.RateLimitRequest{Domain: "d", Descriptors: make([]*commonpb.RateLimitDescriptor, 100_000)}
	for i := range req.Descriptors {
		req.Descriptors[i] = &commonpb.RateLimitDescriptor{}
	}
	_, err = rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), req)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptors: 1001, at most 1000") {
		t.Errorf("100,000 descriptors: %v, want InvalidArgument counting 1001 of them", err)
	}
}

func TestParseConfigBounds(t *testing.T) {
	c, err := parseConfig(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxInflight != admit.DefaultMax {
		t.Errorf("defaults: %+v", c)
	}
	for _, args := range [][]string{
		{"--max-inflight", "0"},
	} {
		if _, err := parseConfig(args, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%v: err %v, want one naming %s", args, err, args[0])
		}
	}
}
