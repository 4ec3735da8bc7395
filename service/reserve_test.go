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

// reserveThrough reserves hits of item's key through s and returns the
// reservation's id.
func reserveThrough(t *testing.T, s *Service, item *pb.CheckItem, hits int64) string {
	t.Helper()
	ttl := int64(600_000)
	item.Hits, item.ReserveTtlMs = &hits, &ttl
	r := check(t, s, item)
	item.Hits, item.ReserveTtlMs = nil, nil
	if r.ReservationId == "" {
		t.Fatalf("reserve %d of %s: %v", hits, item.Key, r)
	}
	return r.ReservationId
}

// TestReservationHandedOffOnJoin: a reservation held by a key's owner
// moves with its counter when a joining node takes the key over, and is
// settled there, once: a retry is replayed.
func TestReservationHandedOffOnJoin(t *testing.T) {
	c, svcs := newFakeCluster(3)
	full := c.ring
	c.ring = full.Without("node-2")
	startAlone(c, svcs[2], 2)
	key, prev := keyMovingTo(t, full, c.ring, "node-2")
	item := &pb.CheckItem{Name: "tokens", Key: key, Limit: 100, DurationMs: 3_600_000}
	id := reserveThrough(t, svcs[0], item, 40)
	c.ring = full
	if sent := svcs[prev].HandOff(t.Context()); sent != 1 {
		t.Fatalf("node-%d handed off %d counters, want 1", prev, sent)
	}
	if svcs[prev].store.Reservations() != 0 || svcs[2].store.Reservations() != 1 {
		t.Fatalf("reservations: node-%d %d, node-2 %d; want the reservation moved to node-2", prev, svcs[prev].store.Reservations(), svcs[2].store.Reservations())
	}
	cost := int64(10)
	settle := &pb.SettleRequest{ReservationId: id, Name: "tokens", Key: key, Cost: &cost}
	got, err := svcs[1].Settle(t.Context(), settle)
	if err != nil || got.GivenBack != 30 || got.State.Remaining != 90 {
		t.Fatalf("settle for 10 after the hand-off: %v, %v; want 30 given back, 90 remaining", got, err)
	}
	if got, err := svcs[0].Settle(t.Context(), settle); err != nil || !got.Replayed || got.State.Remaining != 90 {
		t.Errorf("retry: %v, %v; want replayed, 90 remaining", got, err)
	}
}

// TestReservationSettledAtTheHeir: a reservation replicated to the key's
// heir is settled there once its owner is down and the ring drops it,
// charged once; one settled at the owner before it died answers a retry
// at the heir as it did, charging nothing more.
func TestReservationSettledAtTheHeir(t *testing.T) {
	c, svcs := newFakeCluster(3)
	key := c.keyInheritedBy(0, 1)
	item := &pb.CheckItem{Name: "tokens", Key: key, Limit: 100, DurationMs: 3_600_000}
	open := reserveThrough(t, svcs[2], item, 30)
	settledFirst := reserveThrough(t, svcs[2], item, 20)
	cost := int64(25)
	first, err := svcs[2].Settle(t.Context(), &pb.SettleRequest{ReservationId: settledFirst, Name: "tokens", Key: key, Cost: &cost})
	if err != nil || first.Forced != 5 {
		t.Fatalf("settle for 25 at the owner: %v, %v", first, err)
	}
	if sent := svcs[0].custody.Replicate(t.Context()); sent != 1 {
		t.Fatalf("node-0 replicated %d counters, want 1", sent)
	}
	c.down["peer-0"] = true
	c.ring = c.ring.Without("node-0")

	retry, err := svcs[2].Settle(t.Context(), &pb.SettleRequest{ReservationId: settledFirst, Name: "tokens", Key: key, Cost: &cost})
	if err != nil || !retry.Replayed || retry.Forced != 5 {
		t.Errorf("retry at the heir: %v, %v; want replayed, 5 forced", retry, err)
	}
	zero := int64(0)
	got, err := svcs[2].Settle(t.Context(), &pb.SettleRequest{ReservationId: open, Name: "tokens", Key: key, Cost: &zero})
	if err != nil || got.GivenBack != 30 || got.State.Remaining != 75 {
		t.Errorf("settle of the open one at the heir: %v, %v; want 30 given back, 75 remaining (25 charged once)", got, err)
	}
}
