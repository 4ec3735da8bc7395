package peer

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/internal/testpki"
	"github.com/ringlimit/ringlimit/limiter"
)

// settleHandler is a fakeHandler that settles relayed reservations: it
// knows one id, and answers any other as the store would.
type settleHandler struct {
	fakeHandler
	from  string
	calls int
}

func (h *settleHandler) Settle(_ context.Context, from string, req *pb.SettleRequest) (*pb.SettleResponse, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.from = from
	h.calls++
	if req.GetReservationId() != "known" {
		return nil, limiter.ErrUnknownReservation
	}
	return &pb.SettleResponse{GivenBack: 7}, nil
}

// TestPoolSettle: a relayed settle reaches the owner's handler with the
// relaying node's name, and the handler's error comes back with its code.
func TestPoolSettle(t *testing.T) {
	h := &settleHandler{}
	addr := serve(t, h)
	p := NewPool(Config{})
	t.Cleanup(func() { p.Close() })
	resp, err := p.Settle(t.Context(), addr, "b", &pb.SettleRequest{ReservationId: "known"})
	if err != nil || resp.GetGivenBack() != 7 || h.from != "b" {
		t.Fatalf("Settle = %v, %v, from %q", resp, err, h.from)
	}
	_, err = p.Settle(t.Context(), addr, "b", &pb.SettleRequest{ReservationId: "other"})
	if status.Code(errors.Unwrap(err)) != codes.NotFound {
		t.Errorf("an unknown reservation: %v, want NotFound", err)
	}
	c := dial(t, addr)
	if _, err := c.Settle(t.Context(), &peerpb.SettleRelayRequest{From: ""}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no sender: %v, want InvalidArgument", err)
	}
	other := dial(t, serve(t, &fakeHandler{}))
	if _, err := other.Settle(t.Context(), &peerpb.SettleRelayRequest{From: "b"}); status.Code(err) != codes.Unimplemented {
		t.Errorf("a handler without reservations: %v, want Unimplemented", err)
	}
}

// TestGuardSettle: relayed settles are taken only from a member, under its
// own certificate's name.
func TestGuardSettle(t *testing.T) {
	ca := testpki.NewCA(t, "cluster")
	h := &settleHandler{}
	addr, _ := guarded(t, h, ca, members{"a", "b", "c"})
	asB := dialAs(t, addr, ca, "b")
	req := func(from string) *peerpb.SettleRelayRequest {
		return &peerpb.SettleRelayRequest{From: from, Settle: &pb.SettleRequest{ReservationId: "known"}}
	}
	if _, err := asB.Settle(t.Context(), req("b")); err != nil {
		t.Fatalf("from b as b: %v", err)
	}
	if _, err := asB.Settle(t.Context(), req("c")); status.Code(err) != codes.PermissionDenied {
		t.Errorf("from c with b's certificate: %v, want PermissionDenied", err)
	}
	if _, err := dialAs(t, addr, ca, "x").Settle(t.Context(), req("x")); status.Code(err) != codes.PermissionDenied {
		t.Errorf("from x, not a member: %v, want PermissionDenied", err)
	}
	if h.calls != 1 {
		t.Errorf("the handler took %d settles, want only b's", h.calls)
	}
}
