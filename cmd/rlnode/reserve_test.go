package main

import (
	"context"
	"encoding/json"
	"io"
	"strings"
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

// TestCheckReserveSettle runs `rlnode check` against a node: --reserve-ttl
// holds hits under a printed reservation id, refused as a check would be;
// --settle charges the real cost, a second time replayed; --release gives
// everything back; bad combinations and an unknown id are errors (exit 2).
func TestCheckReserveSettle(t *testing.T) {
	_, grpcAddr, stop := startNode(t)
	defer stop()
	check := func(args ...string) (int, string, error) {
		var out strings.Builder
		err := run(context.Background(), append([]string{"check", "--addr", grpcAddr, "--name", "tokens", "--key", "acme"}, args...), env(nil), &out, io.Discard)
		return exitCode(err, io.Discard), out.String(), err
	}
	reserve := func(hits string) string {
		t.Helper()
		code, out, err := check("--limit", "100", "--duration", "1h", "--hits", hits, "--reserve-ttl", "10m", "--json")
		var got struct {
			Status        string `json:"status"`
			Remaining     int64  `json:"remaining"`
			ReservationID string `json:"reservation_id"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.ReservationID == "" {
			t.Fatalf("reserve %s: exit %d, %q, %v; want 0 and a reservation_id", hits, code, out, err)
		}
		return got.ReservationID
	}
	id := reserve("60")
	if code, out, _ := check("--limit", "100", "--duration", "1h", "--hits", "60", "--reserve-ttl", "10m"); code != 1 || !strings.HasPrefix(out, "REFUSED  40 of 100 remaining") {
		t.Errorf("a second reservation of 60: exit %d, %q; want 1, refused with 40 remaining", code, out)
	}
	if code, out, err := check("--settle", id, "--cost", "15"); code != 0 || !strings.HasPrefix(out, "SETTLED for 15: 45 given back, 0 forced; 85 of 100 remaining") {
		t.Errorf("settle for 15: exit %d, %q, %v", code, out, err)
	}
	if code, out, _ := check("--settle", id, "--cost", "15", "--json"); code != 0 || !strings.Contains(out, `"replayed":true`) || !strings.Contains(out, `"remaining":85`) {
		t.Errorf("the settle again: exit %d, %q; want it replayed, nothing charged", code, out)
	}
	id = reserve("50")
	if code, out, err := check("--release", id); code != 0 || !strings.HasPrefix(out, "RELEASED: 50 given back, 0 forced; 85 of 100 remaining") {
		t.Errorf("release: exit %d, %q, %v", code, out, err)
	}
	if code, out, _ := check("--limit", "100", "--duration", "1h", "--hits", "10", "--reserve-ttl", "10m"); code != 0 || !strings.Contains(out, "RESERVED 10 under ") ||
		!strings.Contains(out, "--settle ") {
		t.Errorf("a reservation, for a person: exit %d, %q", code, out)
	}
	for _, tc := range []struct {
		name string
		args []string
		err  string
	}{
		{"unknown id", []string{"--settle", strings.Repeat("ab", 16), "--cost", "1"}, "unknown"},
		{"forged id", []string{"--settle", "xyz", "--cost", "1"}, "reservation_id"},
		{"settle without a cost", []string{"--settle", id}, "--settle needs --cost"},
		{"release with a cost", []string{"--release", id, "--cost", "3"}, "no --cost"},
		{"both", []string{"--settle", id, "--release", id, "--cost", "3"}, "one or the other"},
		{"a cost without --settle", []string{"--limit", "1", "--cost", "3"}, "--cost goes with --settle"},
		{"a reservation of a spacing", []string{"--limit", "100", "--min-interval", "1s", "--reserve-ttl", "1m"}, "min_interval_ms"},
		{"a reservation while borrowing", []string{"--limit", "100", "--ceiling", "200", "--parent-key", "all", "--parent-limit", "1000", "--reserve-ttl", "1m"}, "ceiling"},
		{"a time-to-live over a day", []string{"--limit", "100", "--reserve-ttl", "25h"}, "reserve_ttl_ms"},
	} {
		if code, _, err := check(tc.args...); code != 2 || err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: exit %d, %v; want 2 and an error naming %q", tc.name, code, err, tc.err)
		}
	}
}
