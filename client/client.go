// Package client is the Go client of ringlimit's gRPC API.
package client

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// Client talks to one rlnode (or a load balancer in front of several). It
// is safe for concurrent use; one Client should serve a whole process.
type Client struct {
	conn *grpc.ClientConn
	rl   pb.RateLimiterClient
}

// New returns a client of the node at addr (host:port). It connects
// lazily. With no options it uses plaintext, as nodes serve by default.
func New(addr string, opts ...grpc.DialOption) (*Client, error) {
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return &Client{conn: conn, rl: pb.NewRateLimiterClient(conn)}, nil
}

// Check sends one request of one or more items.
func (c *Client) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	return c.rl.Check(ctx, req)
}

// Allow spends one hit of a limit of count per period for key, with the
// default algorithm and behaviour, and returns the verdict.
func (c *Client) Allow(ctx context.Context, name, key string, count int64, period time.Duration) (*pb.CheckResult, error) {
	resp, err := c.Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{{
		Name: name, Key: key, Limit: count, DurationMs: period.Milliseconds(),
	}}})
	if err != nil {
		return nil, err
	}
	if len(resp.Responses) != 1 {
		return nil, fmt.Errorf("check %s: %d results for 1 item", key, len(resp.Responses))
	}
	return resp.Responses[0], nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }
