package api

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/service"
)

// TestMembersAndRingHeader: Members answers the node's ring, sorted by
// name, with a fingerprint that depends on the members alone; a Check
// that names another fingerprint in RingHeader is answered with the
// node's, and one that names the node's, or none, gets no header.
func TestMembersAndRingHeader(t *testing.T) {
	a := ring.Member{Name: "a", PeerAddr: "10.0.0.1:8082", GRPCAddr: "10.0.0.1:8081"}
	b := ring.Member{Name: "b", PeerAddr: "10.0.0.2:8082", GRPCAddr: "10.0.0.2:8081"}
	var current atomic.Pointer[ring.Ring]
	current.Store(ring.New(b, a))

	rl := pb.NewRateLimiterClient(serveGRPC(t, New(Config{Checker: service.New(service.Config{}), Ring: current.Load})))
	ctx := context.Background()

	members := func() *pb.MembersResponse {
		t.Helper()
		resp, err := rl.Members(ctx, &pb.MembersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	first := members()
	if len(first.Members) != 2 || first.Members[0].Name != "a" || first.Members[0].GrpcAddr != a.GRPCAddr ||
		first.Members[1].Name != "b" || first.Members[1].GrpcAddr != b.GRPCAddr {
		t.Errorf("Members = %v, want a and b, by name, with their client addresses", first.Members)
	}
	current.Store(ring.New(a, b))
	if again := members(); again.Ring != first.Ring {
		t.Errorf("a ring rebuilt from the same members has fingerprint %x, was %x", again.Ring, first.Ring)
	}
	moved := b
	moved.GRPCAddr = "10.0.0.3:8081"
	current.Store(ring.New(a, moved))
	if again := members(); again.Ring == first.Ring {
		t.Error("a member's new address left the fingerprint as it was")
	}

	ours := members().Ring
	check := func(sent ...string) []string {
		t.Helper()
		ctx := ctx
		if len(sent) > 0 {
			ctx = metadata.AppendToOutgoingContext(ctx, RingHeader, sent[0])
		}
		var header metadata.MD
		if _, err := rl.Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{{Name: "n", Key: "k", Limit: 9, DurationMs: 1000}}},
			grpc.Header(&header)); err != nil {
			t.Fatal(err)
		}
		return header.Get(RingHeader)
	}
	hex := strconv.FormatUint(ours, 16) // as RingHeader's doc says
	if got := check("0"); len(got) != 1 || got[0] != hex {
		t.Errorf("a Check routed by another ring got %s %v, want [%s]", RingHeader, got, hex)
	}
	if got := check(hex); got != nil {
		t.Errorf("a Check routed by the node's ring got %s %v, want none", RingHeader, got)
	}
	if got := check(); got != nil {
		t.Errorf("a Check without %s got %v, want none", RingHeader, got)
	}
}
