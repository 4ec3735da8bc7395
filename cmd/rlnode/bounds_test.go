package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

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
	if c.MaxInflight != admit.DefaultMax || c.MaxConns != defaultMaxConns {
		t.Errorf("defaults: %+v", c)
	}
	for _, args := range [][]string{
		{"--max-inflight", "0"},
		{"--max-conns", "-1"},
	} {
		if _, err := parseConfig(args, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%v: err %v, want one naming %s", args, err, args[0])
		}
	}
}

// TestMaxConns opens --max-conns idle connections to the HTTP port: a
// further client is not served until one of them closes.
func TestMaxConns(t *testing.T) {
	httpAddr, _, _ := startNode(t, "--max-conns", "2")
	var idle []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	answered := make(chan error, 1)
	go func() {
		client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
		resp, err := client.Get("http://" + httpAddr + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		answered <- err
	}()
	// A negative can only be seen by waiting: the third connection sits in
	// the kernel's backlog, unaccepted.
	select {
	case err := <-answered:
		t.Fatalf("a third connection was served while two were open (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	idle[0].Close()
	if err := <-answered; err != nil {
		t.Errorf("after one connection closed: %v", err)
	}
}
