package peer

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/internal/testpki"
)

// leaseHandler is a fakeHandler that takes relayed lease reports: it
// answers each with a grant of its admitted hits plus one, and records
// who relayed them for which account.
type leaseHandler struct {
	fakeHandler
	from   string
	lessee []byte
	calls  int
}

func (h *leaseHandler) Lease(_ context.Context, from string, lessee []byte, reports []*pb.LeaseReport) ([]*pb.LeaseGrant, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.from, h.lessee = from, lessee
	h.calls++
	var out []*pb.LeaseGrant
	for _, r := range reports {
		out = append(out, &pb.LeaseGrant{Epoch: r.GetEpoch(), Granted: r.GetAdmitted() + 1, Acked: r.GetAdmitted()})
	}
	return out, nil
}

// TestPoolLease: a relay reaches the owner's handler with the relaying
// node's name and the account id, and brings its answers back in order.
func TestPoolLease(t *testing.T) {
	h := &leaseHandler{}
	addr := serve(t, h)
	p := NewPool(Config{})
	t.Cleanup(func() { p.Close() })
	id := []byte("0123456789abcdef")
	grants, err := p.Lease(t.Context(), addr, "b", id, []*pb.LeaseReport{{Epoch: 1, Admitted: 5}, {Epoch: 2, Admitted: 7}})
	if err != nil {
		t.Fatal(err)
	}
	if len(grants) != 2 || grants[0].GetGranted() != 6 || grants[1].GetGranted() != 8 {
		t.Errorf("grants %v, want two, in order", grants)
	}
	if h.from != "b" || string(h.lessee) != string(id) {
		t.Errorf("the handler saw from %q, lessee %q", h.from, h.lessee)
	}
}

// TestServerLeaseBounds: a relay of too many reports is refused whole,
// with no more decoded than one beyond the bound; a node whose handler
// takes no lease reports answers Unimplemented; a malformed sender is
// refused.
func TestServerLeaseBounds(t *testing.T) {
	h := &leaseHandler{}
	addr := serve(t, h)
	c := dial(t, addr)
	many := make([]*pb.LeaseReport, 100*checks.MaxItems) // empty: a few bytes each
	for i := range many {
		many[i] = &pb.LeaseReport{}
	}
	_, err := c.Lease(t.Context(), &peerpb.LeaseRelayRequest{From: "b", Lessee: make([]byte, 16), Reports: many})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("%d reports: %v, want InvalidArgument", len(many), err)
	}
	if h.calls != 0 {
		t.Error("the handler was called for a relay refused whole")
	}
	if _, err := c.Lease(t.Context(), &peerpb.LeaseRelayRequest{From: "", Reports: many[:1]}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no sender: %v, want InvalidArgument", err)
	}
	other := dial(t, serve(t, &fakeHandler{}))
	if _, err := other.Lease(t.Context(), &peerpb.LeaseRelayRequest{From: "b", Reports: many[:1]}); status.Code(err) != codes.Unimplemented {
		t.Errorf("a handler without leases: %v, want Unimplemented", err)
	}
}

// TestGuardLease: relayed lease reports are taken only from a member,
// under its own certificate's name.
func TestGuardLease(t *testing.T) {
	ca := testpki.NewCA(t, "cluster")
	h := &leaseHandler{}
	addr, _ := guarded(t, h, ca, members{"a", "b", "c"})
	asB := dialAs(t, addr, ca, "b")
	req := func(from string) *peerpb.LeaseRelayRequest {
		return &peerpb.LeaseRelayRequest{From: from, Lessee: make([]byte, 16), Reports: []*pb.LeaseReport{{Epoch: 1}}}
	}
	if _, err := asB.Lease(t.Context(), req("b")); err != nil {
		t.Fatalf("from b as b: %v", err)
	}
	if _, err := asB.Lease(t.Context(), req("c")); status.Code(err) != codes.PermissionDenied {
		t.Errorf("from c with b's certificate: %v, want PermissionDenied", err)
	}
	asX := dialAs(t, addr, ca, "x")
	if _, err := asX.Lease(t.Context(), req("x")); status.Code(err) != codes.PermissionDenied {
		t.Errorf("from x, not a member: %v, want PermissionDenied", err)
	}
	if h.calls != 1 {
		t.Errorf("the handler took %d relays, want only b's", h.calls)
	}
}

// TestCodecBoundsLeaseRelay: the peer port's codec builds at most one
// report beyond checks.MaxItems, however many a relay holds.
func TestCodecBoundsLeaseRelay(t *testing.T) {
	req := &peerpb.LeaseRelayRequest{From: "b", Lessee: make([]byte, 16)}
	for range 10 * checks.MaxItems {
		req.Reports = append(req.Reports, &pb.LeaseReport{Epoch: 1})
	}
	data, err := codec{}.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var got peerpb.LeaseRelayRequest
	if err := (codec{}).Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if n := len(got.GetReports()); n != checks.MaxItems+1 || got.GetFrom() != "b" {
		t.Errorf("decoded %d reports from %q, want %d from b", n, got.GetFrom(), checks.MaxItems+1)
	}
}

// FuzzLeaseRelayCodec decodes arbitrary bytes as a relayed lease request
// through the peer port's codec: never a panic, never more reports built
// than one beyond the bound.
func FuzzLeaseRelayCodec(f *testing.F) {
	for _, req := range []*peerpb.LeaseRelayRequest{
		{From: "b", Lessee: make([]byte, 16), Reports: []*pb.LeaseReport{{Epoch: 1, Item: &pb.CheckItem{Name: "api", Key: "k"}}}},
		{Reports: make([]*pb.LeaseReport, 3)},
	} {
		for i := range req.Reports {
			if req.Reports[i] == nil {
				req.Reports[i] = &pb.LeaseReport{}
			}
		}
		data, err := codec{}.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data.Materialize())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m peerpb.LeaseRelayRequest
		if err := (codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &m); err != nil {
			return
		}
		if n := len(m.GetReports()); n > checks.MaxItems+1 {
			t.Errorf("built %d reports, more than %d", n, checks.MaxItems+1)
		}
	})
}
