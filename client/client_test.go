package client_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/api"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/service"
)

func TestAllow(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	api.New(api.Config{Checker: service.New(service.Config{})}).RegisterGRPC(srv)
	go srv.Serve(lis)
	defer srv.Stop()

	c, err := client.New(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i, want := range []pb.Status{pb.Status_UNDER_LIMIT, pb.Status_OVER_LIMIT} {
		r, err := c.Allow(ctx, "api", "user:42", 1, time.Minute)
		if err != nil || r.Status != want {
			t.Errorf("Allow #%d = %v, %v; want %v", i+1, r, err, want)
		}
	}
}
