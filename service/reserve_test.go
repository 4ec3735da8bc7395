package service

import (
	"context"
	"errors"
	"testing"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/limiter"
)

// TestReserveAndSettleAcrossNodes: a reservation made through one node is
// held by its key's owner, and a settle sent to any node is relayed there:
// it gives back once, a retry through a third node is replayed, and the
// owner's errors keep their kinds.
func TestReserveAndSettleAcrossNodes(t *testing.T) {
	c, svcs := newFakeCluster(3)
	ctx := context.Background()
	key := c.keyOwnedBy(1)
	hits, ttl := int64(1000), int64(60_000)
	item := &pb.CheckItem{Name: "tokens", Key: key, Limit: 20_000, DurationMs: 60_000, Hits: &hits, ReserveTtlMs: &ttl}
	resp, err := svcs[0].Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
	if err != nil || resp.Responses[0].ReservationId == "" || resp.Responses[0].Remaining != 19_000 {
		t.Fatalf("reserve through node-0: %v, %v", resp, err)
	}
	id := resp.Responses[0].ReservationId
	if svcs[1].store.Reservations() != 1 || svcs[0].store.Reservations() != 0 {
		t.Fatalf("reservations held: node-0 %d, node-1 %d; want the owner, node-1, to hold it", svcs[0].store.Reservations(), svcs[1].store.Reservations())
	}
	cost := int64(300)
	settle := &pb.SettleRequest{ReservationId: id, Name: "tokens", Key: key, Cost: &cost}
	got, err := svcs[2].Settle(ctx, settle)
	if err != nil || got.GivenBack != 700 || got.State.Remaining != 19_700 || got.Replayed {
		t.Fatalf("settle through node-2: %v, %v", got, err)
	}
	got, err = svcs[0].Settle(ctx, settle)
	if err != nil || !got.Replayed || got.State.Remaining != 19_700 {
		t.Errorf("retry through node-0: %v, %v; want the same answer, replayed", got, err)
	}
	other := int64(5)
	if _, err := svcs[2].Settle(ctx, &pb.SettleRequest{ReservationId: id, Name: "tokens", Key: key, Cost: &other}); !errors.Is(err, limiter.ErrSettled) || checks.Code(err) != checks.Code(limiter.ErrSettled) {
		t.Errorf("another cost through node-2: %v, want ErrSettled", err)
	}
	forged := &pb.SettleRequest{ReservationId: "0123456789abcdef0123456789abcdef", Name: "tokens", Key: key}
	if _, err := svcs[0].Settle(ctx, forged); !errors.Is(err, limiter.ErrUnknownReservation) {
		t.Errorf("forged id through node-0: %v, want ErrUnknownReservation", err)
	}
	if _, err := svcs[1].Settle(ctx, forged); !errors.Is(err, limiter.ErrUnknownReservation) {
		t.Errorf("forged id at the owner: %v, want ErrUnknownReservation", err)
	}
	if _, err := svcs[0].Settle(ctx, &pb.SettleRequest{ReservationId: id, Name: "other", Key: key}); !errors.Is(err, checks.ErrInvalid) {
		t.Errorf("another name through node-0: %v, want invalid", err)
	}

	c.down["peer-1"] = true
	if _, err := svcs[0].Settle(ctx, settle); !errors.Is(err, checks.ErrUnavailable) {
		t.Errorf("settle with the owner down: %v, want unavailable", err)
	}
}

// TestReserveAtTheHeir: a reservation whose owner cannot be reached is
// held by the key's heir, which decides it (failover) and becomes its
// owner once the ring drops the dead node: settles sent meanwhile are
// refused as unavailable and may be sent again, and settle once the ring
// has moved.
func TestReserveAtTheHeir(t *testing.T) {
	c, svcs := newFakeCluster(2)
	key := c.keyOwnedBy(1)
	c.down["peer-1"] = true
	hits, ttl := int64(10), int64(60_000)
	resp, err := svcs[0].Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{
		{Name: "tokens", Key: key, Limit: 100, DurationMs: 60_000, Hits: &hits, ReserveTtlMs: &ttl}}})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.Responses[0]
	if r.ReservationId == "" || r.Metadata[MetadataDecidedBy] != routeFailover || svcs[0].store.Reservations() != 1 {
		t.Fatalf("reserve with the owner down: %v; want it held by the heir, node-0", r)
	}
	settle := &pb.SettleRequest{ReservationId: r.ReservationId, Name: "tokens", Key: key}
	if _, err := svcs[0].Settle(context.Background(), settle); !errors.Is(err, checks.ErrUnavailable) {
		t.Errorf("release while the ring still has the dead owner: %v, want unavailable", err)
	}
	c.ring = c.ring.Without("node-1")
	got, err := svcs[0].Settle(context.Background(), settle)
	if err != nil || got.GivenBack != 10 || got.State.Remaining != 100 {
		t.Errorf("release once the ring dropped the dead owner: %v, %v", got, err)
	}
}
