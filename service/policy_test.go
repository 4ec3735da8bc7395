package service

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/policy"
)

func loadPolicies(t *testing.T) *policy.Reloader {
	t.Helper()
	path := filepath.Join(t.TempDir(), "p.yaml")
	yaml := `domain: api
descriptors:
  - key: tier
    value: free
    rate_limit: {unit: minute, requests_per_unit: 10, soft_percent: 20}
  - key: tier
    value: gold
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: TOKEN_BUCKET}
  - key: tier
    value: open
    rate_limit: {unlimited: true}
  - key: tier
    value: closed
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: tier
    value: spaced
    rate_limit: {unit: hour, requests_per_unit: 100, min_interval_ms: 1500}
  - key: tier
    value: shared
    rate_limit: {unit: hour, requests_per_unit: 1, ceiling: 3, parent: {requests_per_unit: 4, unit: hour}}
  - key: tier
    value: tokens
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: TOKEN_BUCKET, reserve_ttl_ms: 60000}
`
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := policy.NewReloader(policy.ReloaderConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestPolicyChecks: a check names a policy instead of a limit; the soft
// limit admits 20% more; errors name the field.
func TestPolicyChecks(t *testing.T) {
	s := New(Config{Now: fixedClock(t0), Policies: loadPolicies(t)})
	item := &pb.CheckItem{Key: "user:1", Policy: "api/tier=free", Hits: hits(11)}
	req := &pb.CheckRequest{Requests: []*pb.CheckItem{item}}
	resp, err := s.Check(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	r := resp.Responses[0]
	if r.Error != "" || r.Status != pb.Status_UNDER_LIMIT || r.Limit != 12 || r.Remaining != 1 ||
		r.ResetTimeMs != t0.Add(60_000_000_000).UnixMilli() {
		t.Errorf("soft limit: %+v, want 11 of 12 admitted in a fixed minute", r)
	}
	if req.Requests[0] != item || item.Policy != "api/tier=free" || item.Limit != 0 || item.Name != "" {
		t.Errorf("the caller's request was changed: %+v", item)
	}
	resp, _ = s.Check(context.Background(), req)
	if r := resp.Responses[0]; r.Status != pb.Status_OVER_LIMIT {
		t.Errorf("second check: %+v, want OVER_LIMIT", r)
	}
	// The default name is the reference, so another policy has its own counter.
	resp, _ = s.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{
		{Key: "user:1", Policy: "api/tier=gold", Hits: hits(2)}}})
	if r := resp.Responses[0]; r.Status != pb.Status_UNDER_LIMIT || r.Limit != 2 || r.ResetTimeMs != t0.Add(1e9).UnixMilli() {
		t.Errorf("gold: %+v", r)
	}

	for _, c := range []struct {
		item *pb.CheckItem
		want string
	}{
		{&pb.CheckItem{Key: "k", Policy: "api/tier=bronze"}, `policy: "api/tier=bronze": no such policy`},
		{&pb.CheckItem{Key: "k", Policy: "api"}, `policy: "api": want domain/key=value`},
		{&pb.CheckItem{Key: "k", Policy: "api/tier=free", Limit: 5}, "limit: must be omitted"},
		{&pb.CheckItem{Key: "k", Policy: "api/tier=free", DurationMs: 5}, "duration_ms: must be omitted"},
		{&pb.CheckItem{Key: "k", Policy: "api/tier=free", Algorithm: pb.Algorithm_GCRA}, "algorithm: must be omitted"},
		{&pb.CheckItem{Key: "k", Policy: "api/tier=free", MinIntervalMs: 10}, "min_interval_ms: must be omitted"},
		{&pb.CheckItem{Key: "k", Policy: "api/tier=free", Ceiling: 10}, "ceiling: must be omitted"},
		{&pb.CheckItem{Key: "k", Policy: "api/tier=free", Parent: &pb.ParentLimit{Key: "p", Limit: 1}}, "parent: must be omitted"},
		{&pb.CheckItem{Key: "k", Policy: "api/tier=open"}, "policy: \"api/tier=open\" is unlimited"},
		{&pb.CheckItem{Key: "k", Policy: "api/tier=closed"}, "policy: \"api/tier=closed\" has requests_per_unit 0"},
		{&pb.CheckItem{Key: "", Policy: "api/tier=free"}, "key: must not be empty"},
	} {
		resp, _ := s.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{c.item}})
		if r := resp.Responses[0]; !strings.HasPrefix(r.Error, c.want) || r.ErrorCode != pb.ErrorCode_INVALID_ARGUMENT {
			t.Errorf("%v: error %q, want %q", c.item, r.Error, c.want)
		}
	}
}

// TestPolicySpacing: a policy's min_interval_ms spaces the checks that
// name it, on the policy's counter.
func TestPolicySpacing(t *testing.T) {
	now := t0
	s := New(Config{Now: clockAt(&now), Policies: loadPolicies(t)})
	item := &pb.CheckItem{Key: "user:1", Policy: "api/tier=spaced"}
	for _, st := range []struct {
		at    time.Duration
		ok    bool
		retry int64
	}{{0, true, 0}, {time.Second, false, 500}, {1500 * time.Millisecond, true, 0}} {
		now = t0.Add(st.at)
		r := check(t, s, item)
		if (r.Status == pb.Status_UNDER_LIMIT) != st.ok || r.RetryAfterMs != st.retry || r.Limit != 100 {
			t.Errorf("at %v: %v, want admitted %v, retry_after_ms %d, limit 100", st.at, r, st.ok, st.retry)
		}
	}
}

// TestPolicyBorrowing: the keys of a policy with a ceiling borrow from one
// parent, the policy's own by default: each is guaranteed 1 an hour and
// may have up to 3 while the 4 the parent holds last.
func TestPolicyBorrowing(t *testing.T) {
	s := New(Config{Now: fixedClock(t0), Policies: loadPolicies(t)})
	var got []string
	for _, key := range []string{"a", "a", "a", "a", "b", "b", "c"} {
		r := check(t, s, &pb.CheckItem{Key: key, Policy: "api/tier=shared"})
		got = append(got, fmt.Sprintf("%s %v borrowed=%v", key, r.Status, r.Borrowed))
	}
	want := []string{
		"a UNDER_LIMIT borrowed=false", "a UNDER_LIMIT borrowed=true", "a UNDER_LIMIT borrowed=true", "a OVER_LIMIT borrowed=false",
		"b UNDER_LIMIT borrowed=false", "b OVER_LIMIT borrowed=false", // the parent's 4 are taken
		"c UNDER_LIMIT borrowed=false", // a guarantee all the same
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("checks:\n got %v\nwant %v", got, want)
	}
}

func TestPolicyWithoutPolicies(t *testing.T) {
	s := New(Config{Now: fixedClock(t0)})
	resp, _ := s.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{{Key: "k", Policy: "api/tier=free"}}})
	if r := resp.Responses[0]; r.Error != "policy: no --policy-file is loaded" {
		t.Errorf("error %q", r.Error)
	}
}

func TestChargeRefusedValidation(t *testing.T) {
	s := New(Config{Now: fixedClock(t0)})
	for _, item := range []*pb.CheckItem{
		{Name: "n", Key: "k", Limit: 1, DurationMs: 1000, ChargeRefused: true},
		{Name: "n", Key: "k", Limit: 1, DurationMs: 1000, ChargeRefused: true, Algorithm: pb.Algorithm_FIXED_WINDOW, Behavior: pb.Behavior_GLOBAL},
	} {
		resp, _ := s.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
		if r := resp.Responses[0]; !strings.HasPrefix(r.Error, "charge_refused: ") {
			t.Errorf("%v: error %q", item, r.Error)
		}
	}
	item := &pb.CheckItem{Name: "n", Key: "k", Limit: 1, DurationMs: 1000, ChargeRefused: true, Algorithm: pb.Algorithm_FIXED_WINDOW}
	for i, want := range []pb.Status{pb.Status_UNDER_LIMIT, pb.Status_OVER_LIMIT, pb.Status_OVER_LIMIT} {
		if i == 2 {
			item.Hits = hits(0) // the refused hit was counted: 2 > 1
		}
		resp, _ := s.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
		if r := resp.Responses[0]; r.Status != want || r.Error != "" {
			t.Errorf("check %d: %+v, want %v", i, r, want)
		}
	}
}

// TestPolicyReserves: a check naming a policy with reserve_ttl_ms
// reserves its hits, settled under the policy's name; a peek of it holds
// nothing; a check's own reserve_ttl_ms is kept.
func TestPolicyReserves(t *testing.T) {
	s := New(Config{Now: fixedClock(t0), Policies: loadPolicies(t)})
	r := check(t, s, &pb.CheckItem{Key: "u", Policy: "api/tier=tokens", Hits: hits(60)})
	if r.Error != "" || r.ReservationId == "" || r.Remaining != 40 {
		t.Fatalf("a check of the reserving policy: %v, want 60 reserved", r)
	}
	cost := int64(10)
	out, err := s.Settle(context.Background(), &pb.SettleRequest{ReservationId: r.ReservationId, Name: "api/tier=tokens", Key: "u", Cost: &cost})
	if err != nil || out.GivenBack != 50 || out.State.Remaining != 90 {
		t.Fatalf("settle for 10: %v, %v; want 50 given back", out, err)
	}
	if p := check(t, s, &pb.CheckItem{Key: "u", Policy: "api/tier=tokens", Hits: hits(0)}); p.Error != "" || p.ReservationId != "" || p.Remaining != 90 {
		t.Errorf("a peek: %v, want no reservation and 90 remaining", p)
	}
	ttl := int64(0)
	resp, err := s.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{{Key: "u", Policy: "api/tier=tokens", ReserveTtlMs: &ttl}}})
	if err != nil || !strings.HasPrefix(resp.Responses[0].Error, "reserve_ttl_ms: must be between 1") {
		t.Errorf("the check's own reserve_ttl_ms of 0: %v, %v; want its error", resp, err)
	}
}
