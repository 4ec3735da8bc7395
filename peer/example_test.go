package peer_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/peer"
)

// owner is a Handler that admits everything.
type owner struct{}

func (owner) Forwarded(_ context.Context, reqs []*pb.CheckRequest) []*pb.CheckResponse {
	out := make([]*pb.CheckResponse, len(reqs))
	for i, r := range reqs {
		out[i] = &pb.CheckResponse{}
		for _, item := range r.GetRequests() {
			out[i].Responses = append(out[i].Responses, &pb.CheckResult{Limit: item.GetLimit(), Remaining: item.GetLimit() - 1})
		}
	}
	return out
}
func (owner) AddGlobalHits(context.Context, string, []*peerpb.GlobalReport) error       { return nil }
func (owner) UpdateGlobals(context.Context, string, []*peerpb.GlobalState) error        { return nil }
func (owner) HandOff(context.Context, string, []*peerpb.CounterState) []*peerpb.Refusal { return nil }
func (o owner) Relayed(ctx context.Context, reqs []*pb.CheckRequest) []*pb.CheckResponse {
	return o.Forwarded(ctx, reqs)
}
func (o owner) Pulled(ctx context.Context, reqs []*pb.CheckRequest) ([]*pb.CheckResponse, error) {
	return o.Forwarded(ctx, reqs), nil
}
func (owner) HandOffDone(context.Context, string, uint64)                                 {}
func (owner) Left(context.Context, string, uint64) error                                  { return nil }
func (owner) Replicate(context.Context, string, []*peerpb.CounterState) []*peerpb.Refusal { return nil }

// Example wires an owner's Server and a forwarding node's Pool over loopback.
func Example() {
	// The owner serves the Peer service on its peer listener.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(peer.ServerOptions()...)
	peer.NewServer(owner{}, nil).Register(srv)
	go srv.Serve(lis)
	defer srv.Stop()

	// The forwarding node runs a Pool; Run owns the batch loops.
	pool := peer.NewPool(peer.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- pool.Run(ctx) }()
	defer func() {
		cancel()
		<-done
		pool.Close() // after Run, and after any hand-off
	}()

	resp, err := pool.Forward(context.Background(), lis.Addr().String(), &pb.CheckRequest{
		Requests: []*pb.CheckItem{{Name: "api", Key: "user-1", Limit: 10, DurationMs: 1000}},
	})
	if err != nil {
		panic(err) // errors.Is(err, peer.ErrUnreachable): decide locally
	}
	fmt.Println(resp.GetResponses()[0].GetRemaining())
	// Output: 9
}
