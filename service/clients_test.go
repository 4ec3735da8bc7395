package service

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/clients"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/policy"
)

// reservations returns a request of n one-hit reservations of fresh keys
// made from prefix, under a limit of 10^9, reserved for ttl.
func reservations(prefix string, n int, ttl time.Duration) *pb.CheckRequest {
	req := &pb.CheckRequest{}
	ms := ttl.Milliseconds()
	for i := range n {
		req.Requests = append(req.Requests, &pb.CheckItem{Name: "tokens", Key: fmt.Sprint(prefix, i), Limit: 1_000_000_000,
			DurationMs: 60_000, ReserveTtlMs: &ms})
	}
	return req
}

// TestOneClientCannotTakeTheReservations is issue 33's reservation flood
// in process, on two nodes: one client's checks, through node-0, reserve
// on fresh keys until they hold --max-reservations-per-client; beyond it
// its reservations are refused, naming the bound, while another client
// (another address range) still reserves, and the first reserves again
// once its reservations expire. On main nothing bounded a client: it
// filled --max-reservations on both owners, and every other client was
// refused.
func TestOneClientCannotTakeTheReservations(t *testing.T) {
	now := t0
	const perClient, maxRes = 300, 1000
	_, svcs := newFakeClusterWith(2, func(int) Config {
		return Config{Now: clockAt(&now), Clients: clients.NewQuota(perClient),
			Store: limiter.New(limiter.Config{MaxReservations: maxRes})}
	})
	attacker := clients.NewContext(context.Background(), clients.Of("192.0.2.1:5000", nil))
	other := clients.NewContext(context.Background(), clients.Of("198.51.100.1:5000", nil))
	reserved, refused := 0, 0
	for r := range 4 {
		resp, err := svcs[0].Check(attacker, reservations(fmt.Sprint("flood", r, ":"), 1000, time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		for _, res := range resp.Responses {
			switch {
			case res.ReservationId != "":
				reserved++
			case strings.Contains(res.Error, "--max-reservations-per-client"):
				refused++
			default:
				t.Fatalf("a flood item: %v", res)
			}
		}
	}
	if reserved != perClient || refused != 4000-perClient {
		t.Errorf("the flood: %d reserved, %d refused naming the bound; want %d and %d", reserved, refused, perClient, 4000-perClient)
	}
	resp, err := svcs[0].Check(other, reservations("other:", 10, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for i, res := range resp.Responses {
		if res.ReservationId == "" {
			t.Fatalf("another client's reservation %d refused: %v", i, res)
		}
	}
	now = now.Add(time.Hour)
	resp, err = svcs[1].Check(attacker, reservations("later:", 1, time.Minute))
	if err != nil || resp.Responses[0].ReservationId == "" {
		t.Errorf("the first client, its reservations expired, at node-1: %v, %v", resp, err)
	}
}

// TestReserveTTLNeedsAPolicy: a client's check reserves for at most an
// hour (checks.DefaultMaxReserveTTL) unless it names a policy whose
// reserve_ttl_ms allows more; a forwarded check, resolved at the node the
// client reached, keeps a day's. On main any check could reserve for a
// day.
func TestReserveTTLNeedsAPolicy(t *testing.T) {
	day := &policy.Limit{RequestsPerUnit: 1_000_000, Unit: policy.Minute, UnitMultiplier: 1, Algorithm: limiter.TokenBucket, ReserveTTL: 24 * time.Hour}
	_, svcs := newFakeClusterWith(2, func(int) Config { return Config{Policies: fixedPolicy{day}} })
	ctx := context.Background()
	resp, err := svcs[0].Check(ctx, reservations("k", 4, 24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for i, res := range resp.Responses {
		if res.ReservationId != "" || !strings.Contains(res.Error, "reserve_ttl_ms") || !strings.Contains(res.Error, "policy") {
			t.Errorf("a day without a policy, item %d: %v; want refused, naming reserve_ttl_ms and the policy", i, res)
		}
	}
	req := reservations("k", 4, 24*time.Hour)
	for _, it := range req.Requests {
		it.Policy, it.Limit, it.DurationMs = "day", 0, 0
	}
	if resp, err = svcs[0].Check(ctx, req); err != nil {
		t.Fatal(err)
	}
	for i, res := range resp.Responses {
		if res.ReservationId == "" {
			t.Errorf("a day under a policy that allows it, item %d: %v", i, res)
		}
	}
	over := reservations("k", 1, 25*time.Hour)
	over.Requests[0].Policy, over.Requests[0].Limit, over.Requests[0].DurationMs = "day", 0, 0
	if resp, err = svcs[0].Check(ctx, over); err != nil || !strings.Contains(resp.Responses[0].Error, "reserve_ttl_ms") {
		t.Errorf("beyond the policy's day: %v, %v; want refused naming reserve_ttl_ms", resp, err)
	}
	if err := checks.CheckClientReserveTTL(reservations("k", 1, time.Hour).Requests[0], 0); err != nil {
		t.Errorf("an hour without a policy: %v", err)
	}
	var fe *checks.FieldError
	if err := checks.CheckClientReserveTTL(reservations("k", 1, time.Hour+time.Millisecond).Requests[0], 0); !errors.As(err, &fe) {
		t.Errorf("an hour and a millisecond without a policy: %v, want a field error", err)
	}
}

// fixedPolicy resolves every policy to its limit.
type fixedPolicy struct{ l *policy.Limit }

func (p fixedPolicy) Resolve(string) (*policy.Limit, error) { return p.l, nil }
