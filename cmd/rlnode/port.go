package main

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/loadgen"
)

// A node has an HTTP port (rlnode members reads it) and a gRPC port
// (rlnode check calls it), and either command given the other port fails
// with an error of the wrong protocol ("http2: frame too large"). After
// such a failure, the command asks the address in the other protocol,
// within probeTimeout, so that its error can say which port it was.
const probeTimeout = time.Second

// answersHTTP reports whether addr answers GET /healthz, as a node's HTTP
// port does.
func answersHTTP(ctx context.Context, addr string, t *client.TLS) bool {
	n, err := loadgen.NewNode(addr, t)
	if err != nil {
		return false
	}
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
	defer cancel()
	return n.Healthy(ctx) == nil
}

// answersGRPC reports whether addr answers the gRPC health service, as a
// node's gRPC port does.
func answersGRPC(ctx context.Context, addr string, t *client.TLS) bool {
	opts, err := loadgen.DialOptions(t, addr)
	if err != nil {
		return false
	}
	if opts == nil {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return false
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err == nil || status.Code(err) == codes.Unimplemented
}
