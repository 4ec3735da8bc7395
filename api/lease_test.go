package api

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/lease"
	"github.com/ringlimit/ringlimit/service"
)

// TestLeaseOverGRPC: the Lease RPC on the client port, with its codec and
// admission: a first report decides its hits and brings a grant back; a
// secret that is not 16 bytes, or more reports than lease.MaxReports
// (decoded no further than one beyond), fail whole with INVALID_ARGUMENT;
// a call the gate refuses never reaches the service; a node without
// leases answers Unimplemented.
func TestLeaseOverGRPC(t *testing.T) {
	svc := service.New(service.Config{})
	full := false
	gate := func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if full {
			return ctx, status.Error(codes.ResourceExhausted, "overloaded")
		}
		return ctx, nil
	}
	rl := pb.NewRateLimiterClient(serveGRPC(t, New(Config{Checker: svc, Leases: svc}), append(ServerOptions(), grpc.InTapHandle(gate))...))
	secret := []byte("0123456789abcdef")
	item := &pb.CheckItem{Name: "api", Key: "k", Limit: 100, DurationMs: 60_000}
	resp, err := rl.Lease(t.Context(), &pb.LeaseRequest{Lessee: secret, Reports: []*pb.LeaseReport{{Item: item, Epoch: 1, Asked: 1, Hits: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	g := resp.GetGrants()[0]
	if g.GetError() != "" || g.GetDecided().GetStatus() != pb.Status_UNDER_LIMIT || g.GetGranted() == 0 || g.GetTtlMs() == 0 ||
		g.GetState().GetRemaining()+g.GetGranted() != 99 || g.GetState().GetLimit() != 100 {
		t.Errorf("first report: %v; want its hit admitted, a grant and 99 left in all", g)
	}

	if _, err := rl.Lease(t.Context(), &pb.LeaseRequest{Lessee: secret[:8]}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("an 8-byte secret: %v, want InvalidArgument", err)
	}
	many := &pb.LeaseRequest{Lessee: secret}
	for range 20 * lease.MaxReports {
		many.Reports = append(many.Reports, &pb.LeaseReport{})
	}
	if _, err := rl.Lease(t.Context(), many); status.Code(err) != codes.InvalidArgument {
		t.Errorf("%d reports: %v, want InvalidArgument", len(many.Reports), err)
	}
	c := newCodec()
	data, err := c.Marshal(many)
	if err != nil {
		t.Fatal(err)
	}
	var decoded pb.LeaseRequest
	if err := c.Unmarshal(data, &decoded); err != nil || len(decoded.GetReports()) != lease.MaxReports+1 {
		t.Errorf("the codec built %d reports of %d, want %d: %v", len(decoded.GetReports()), len(many.Reports), lease.MaxReports+1, err)
	}

	full = true
	if _, err := rl.Lease(t.Context(), &pb.LeaseRequest{Lessee: secret}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("through a full gate: %v, want ResourceExhausted", err)
	}
	plain := pb.NewRateLimiterClient(serveGRPC(t, New(Config{Checker: svc})))
	if _, err := plain.Lease(t.Context(), &pb.LeaseRequest{Lessee: secret}); status.Code(err) != codes.Unimplemented {
		t.Errorf("a node without leases: %v, want Unimplemented", err)
	}
}
