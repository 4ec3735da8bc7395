package rls_test

import (
	"context"
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/policy"
	"github.com/ringlimit/ringlimit/rls"
	"github.com/ringlimit/ringlimit/service"
)

// FuzzShouldRateLimit decodes arbitrary bytes as a request, as the gRPC
// server does, and checks that the answer is an error or has one status
// per descriptor.
func FuzzShouldRateLimit(f *testing.F) {
	for _, req := range []*rlspb.RateLimitRequest{
		{Domain: "envoy", Descriptors: ds(desc("user", "alice", "path", "/x"), addend(desc("path", "/files/a"), 0))},
		{Domain: "envoy", HitsAddend: 3, Descriptors: ds(desc("plan", "free"), desc("plan", "paid"), desc("blocked", "x"))},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	policies, err := policy.NewReloader(policy.ReloaderConfig{Path: "testdata/envoy.yaml"})
	if err != nil {
		f.Fatal(err)
	}
	s := rls.New(rls.Config{Checker: service.New(service.Config{}), Policies: policies})
	f.Fuzz(func(t *testing.T, data []byte) {
		var req rlspb.RateLimitRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		resp, err := s.ShouldRateLimit(context.Background(), &req)
		if err == nil && len(resp.Statuses) != len(req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
		}
	})
}
