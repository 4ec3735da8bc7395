package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/service"
)

// fallbackChecker answers as a node whose owner was unreachable.
type fallbackChecker struct{}

func (fallbackChecker) Check(_ context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	resp := &pb.CheckResponse{}
	for range req.Requests {
		resp.Responses = append(resp.Responses, &pb.CheckResult{Limit: 1, Metadata: map[string]string{service.MetadataDecidedBy: "fallback"}})
	}
	return resp, nil
}

// TestFallbackIsMarked: a response with a check not decided by its owner
// says so in an HTTP header and a gRPC trailer, besides the result.
func TestFallbackIsMarked(t *testing.T) {
	s := New(Config{Checker: fallbackChecker{}})

	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/check", "application/json",
		strings.NewReader(`{"requests":[{"name":"a","key":"k","limit":1,"duration_ms":1000}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get(DecidedByHeader); got != "fallback" {
		t.Errorf("HTTP header %s = %q, want fallback", DecidedByHeader, got)
	}

	var trailer metadata.MD
	if _, err := pb.NewRateLimiterClient(serveGRPC(t, s)).Check(context.Background(),
		&pb.CheckRequest{Requests: []*pb.CheckItem{{Name: "a", Key: "k", Limit: 1, DurationMs: 1000}}}, grpc.Trailer(&trailer)); err != nil {
		t.Fatal(err)
	}
	if got := trailer.Get(DecidedByHeader); len(got) != 1 || got[0] != "fallback" {
		t.Errorf("gRPC trailer %s = %v, want [fallback]", DecidedByHeader, got)
	}
}
