package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// TestClusterReservations runs reservations over a real 3-node cluster
// (memberlist, gRPC, the peer port): 50 concurrent reservations of 1,000
// against 20,000 a minute, sent to all three nodes, hold exactly 20 (the
// rest are refused); settling two of them for 500 through another node,
// which relays the settles to the key's owner, lets the next one in at
// once; a settle sent again through the third node is replayed and
// charges once. Every check is evaluated at one instant (created_at_ms,
// within --max-clock-skew), so no refill blurs the counts.
func TestClusterReservations(t *testing.T) {
	c := startCluster(t, 3)
	rls := make([]pb.RateLimiterClient, len(c.nodes))
	for i, n := range c.nodes {
		conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		rls[i] = pb.NewRateLimiterClient(conn)
	}
	at := time.Now().Add(5 * time.Minute).UnixMilli()
	hits, ttl := int64(1000), int64(10*60_000)
	item := &pb.CheckItem{Name: "tokens", Key: "tenant:acme", Limit: 20_000, DurationMs: 60_000, Hits: &hits, ReserveTtlMs: &ttl, CreatedAtMs: at}
	reserve := func(rl pb.RateLimiterClient) *pb.CheckResult {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := rl.Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
		if err != nil {
			t.Error(err)
			return &pb.CheckResult{}
		}
		if r := resp.Responses[0]; r.Error != "" {
			t.Errorf("reserve: %s", r.Error)
		}
		return resp.Responses[0]
	}
	var mu sync.Mutex
	var held []string
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			if r := reserve(rls[i%3]); r.ReservationId != "" {
				mu.Lock()
				held = append(held, r.ReservationId)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(held) != 20 {
		t.Fatalf("%d of 50 reservations of 1,000 held against 20,000, want 20", len(held))
	}
	if r := reserve(rls[0]); r.Status != pb.Status_OVER_LIMIT {
		t.Fatalf("a 21st reservation admitted: %v", r)
	}
	cost := int64(500)
	for i, id := range held[:2] {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := rls[(i+1)%3].Settle(ctx, &pb.SettleRequest{ReservationId: id, Name: "tokens", Key: "tenant:acme", Cost: &cost})
		cancel()
		if err != nil || resp.GivenBack != 500 {
			t.Fatalf("settle for 500 through node-%d: %v, %v", (i+1)%3, resp, err)
		}
	}
	if r := reserve(rls[2]); r.Status != pb.Status_UNDER_LIMIT || r.ReservationId == "" {
		t.Fatalf("after two settled for 500, the next reservation was refused: %v", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	again, err := rls[2].Settle(ctx, &pb.SettleRequest{ReservationId: held[0], Name: "tokens", Key: "tenant:acme", Cost: &cost})
	if err != nil || !again.Replayed || again.GivenBack != 500 {
		t.Errorf("settle sent again through node-2: %v, %v; want it replayed", again, err)
	}
	if r := reserve(rls[1]); r.Status != pb.Status_OVER_LIMIT {
		t.Errorf("a replayed settle gave back again: %v", r)
	}
}
