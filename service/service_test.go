package service

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/limiter"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func fixedClock(t time.Time) func() time.Time { return func() time.Time { return t } }

func hits(n int64) *int64 { return &n }

func valid() *pb.CheckItem {
	return &pb.CheckItem{Name: "api", Key: "user:42", Limit: 10, DurationMs: 60_000}
}

func TestInvalidItemsNameTheField(t *testing.T) {
	cases := []struct {
		field  string
		mutate func(*pb.CheckItem)
	}{
		{"name", func(i *pb.CheckItem) { i.Name = "" }},
		{"name", func(i *pb.CheckItem) { i.Name = strings.Repeat("n", limiter.MaxNameLen+1) }},
		{"key", func(i *pb.CheckItem) { i.Key = "" }},
		{"key", func(i *pb.CheckItem) { i.Key = strings.Repeat("k", limiter.MaxKeyLen+1) }},
		{"limit", func(i *pb.CheckItem) { i.Limit = 0 }},
		{"limit", func(i *pb.CheckItem) { i.Limit = -5 }},
		{"limit", func(i *pb.CheckItem) { i.Limit = checks.MaxLimit + 1 }},
		{"limit", func(i *pb.CheckItem) { i.Algorithm = pb.Algorithm_SLIDING_LOG; i.Limit = 1_000_000 }},
		{"duration_ms", func(i *pb.CheckItem) { i.DurationMs = 0 }},
		{"duration_ms", func(i *pb.CheckItem) { i.DurationMs = checks.MaxDuration.Milliseconds() + 1 }},
		{"hits", func(i *pb.CheckItem) { i.Hits = hits(-1) }},
		{"burst", func(i *pb.CheckItem) { i.Burst = -1 }},
		{"algorithm", func(i *pb.CheckItem) { i.Algorithm = 99 }},
		{"behavior", func(i *pb.CheckItem) { i.Behavior = 99 }},
		{"created_at_ms", func(i *pb.CheckItem) { i.CreatedAtMs = t0.Add(-11 * time.Minute).UnixMilli() }},
		{"created_at_ms", func(i *pb.CheckItem) { i.CreatedAtMs = t0.Add(11 * time.Minute).UnixMilli() }},
		{"algorithm", func(i *pb.CheckItem) { i.Algorithm = 6 }}, // SPACING is a kind of counter, not an algorithm
		{"min_interval_ms", func(i *pb.CheckItem) { i.MinIntervalMs = -1 }},
		{"min_interval_ms", func(i *pb.CheckItem) { i.MinIntervalMs = checks.MaxDuration.Milliseconds() + 1 }},
		{"min_interval_ms", func(i *pb.CheckItem) { i.MinIntervalMs = 10; i.Behavior = pb.Behavior_GLOBAL }},
		{"min_interval_ms", func(i *pb.CheckItem) {
			i.MinIntervalMs, i.Limit, i.DurationMs, i.Behavior = 10, 0, 0, pb.Behavior_GLOBAL
		}},
		{"charge_refused", func(i *pb.CheckItem) {
			i.MinIntervalMs, i.Algorithm, i.ChargeRefused = 10, pb.Algorithm_FIXED_WINDOW, true
		}},
		{"burst", func(i *pb.CheckItem) { i.MinIntervalMs, i.Limit, i.DurationMs, i.Burst = 10, 0, 0, 5 }},
		{"algorithm", func(i *pb.CheckItem) {
			i.MinIntervalMs, i.Limit, i.DurationMs, i.Algorithm = 10, 0, 0, pb.Algorithm_GCRA
		}},
		{"limit", func(i *pb.CheckItem) { i.MinIntervalMs, i.Limit = 10, 0 }}, // with duration_ms: not a spacing alone
		{"duration_ms", func(i *pb.CheckItem) { i.MinIntervalMs, i.DurationMs = 10, 0 }},
	}
	for _, c := range cases {
		s := New(Config{Now: fixedClock(t0)})
		bad := valid()
		c.mutate(bad)
		resp, err := s.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{valid(), bad, valid()}})
		if err != nil {
			t.Fatalf("%s: Check: %v", c.field, err)
		}
		r := resp.Responses[1]
		if !strings.HasPrefix(r.Error, c.field+": ") || r.ErrorCode != pb.ErrorCode_INVALID_ARGUMENT {
			t.Errorf("%s: error %q (%v), want it to start with %q", c.field, r.Error, r.ErrorCode, c.field+": ")
		}
		if r.Status != pb.Status_OVER_LIMIT {
			t.Errorf("%s: invalid item has status %v, want OVER_LIMIT (fail closed)", c.field, r.Status)
		}
		for _, i := range []int{0, 2} {
			if resp.Responses[i].Error != "" || resp.Responses[i].Status != pb.Status_UNDER_LIMIT {
				t.Errorf("%s: valid item %d not answered: %+v", c.field, i, resp.Responses[i])
			}
		}
	}
}

func TestTooManyItems(t *testing.T) {
	s := New(Config{})
	items := make([]*pb.CheckItem, checks.MaxItems+1)
	for i := range items {
		items[i] = valid()
	}
	_, err := s.Check(context.Background(), &pb.CheckRequest{Requests: items})
	if !errors.Is(err, checks.ErrInvalid) || !strings.HasPrefix(err.Error(), "requests: ") {
		t.Errorf("Check(%d items) = %v, want an invalid-argument error naming requests", len(items), err)
	}
}

func TestResultFields(t *testing.T) {
	s := New(Config{Now: fixedClock(t0)})
	item := &pb.CheckItem{Name: "api", Key: "ip:1.2.3.4", Limit: 2, DurationMs: 1000, Hits: hits(2)}
	check := func() *pb.CheckResult {
		resp, err := s.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Responses[0]
	}
	r := check()
	want := &pb.CheckResult{Status: pb.Status_UNDER_LIMIT, Limit: 2, Remaining: 0, ResetTimeMs: t0.Add(time.Second).UnixMilli()}
	if r.Status != want.Status || r.Limit != want.Limit || r.Remaining != want.Remaining || r.ResetTimeMs != want.ResetTimeMs || r.RetryAfterMs != 0 {
		t.Errorf("admitted: got %+v, want %+v", r, want)
	}
	item.Hits = hits(1)
	r = check()
	if r.Status != pb.Status_OVER_LIMIT || r.RetryAfterMs != 500 {
		t.Errorf("refused: got %v retry %d, want OVER_LIMIT retry 500", r.Status, r.RetryAfterMs)
	}
	item.Hits = hits(3)
	if r = check(); r.RetryAfterMs != -1 {
		t.Errorf("hits > capacity: retry_after_ms %d, want -1", r.RetryAfterMs)
	}
}

func TestCreatedAtWithinSkewIsHonoured(t *testing.T) {
	s := New(Config{Now: fixedClock(t0)})
	item := &pb.CheckItem{Name: "api", Key: "k", Limit: 1, DurationMs: 60_000, Algorithm: pb.Algorithm_FIXED_WINDOW,
		CreatedAtMs: t0.Add(-5 * time.Minute).UnixMilli()}
	resp, _ := s.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
	if got, want := resp.Responses[0].ResetTimeMs, t0.Add(-4*time.Minute).UnixMilli(); got != want {
		t.Errorf("reset_time_ms = %d, want %d: the window of created_at_ms", got, want)
	}
}

func TestAllDecidesSameKeyTogether(t *testing.T) {
	s := New(Config{Now: fixedClock(t0)})
	req := &pb.CheckRequest{All: true, Requests: []*pb.CheckItem{
		{Name: "per-minute", Key: "user:1", Limit: 100, DurationMs: 60_000},
		{Name: "per-second", Key: "user:1", Limit: 2, DurationMs: 1000},
		{Name: "per-second", Key: "user:2", Limit: 5, DurationMs: 1000},
	}}
	for range 2 {
		s.Check(context.Background(), req)
	}
	resp, _ := s.Check(context.Background(), req)
	got := []pb.Status{resp.Responses[0].Status, resp.Responses[1].Status, resp.Responses[2].Status}
	want := []pb.Status{pb.Status_OVER_LIMIT, pb.Status_OVER_LIMIT, pb.Status_UNDER_LIMIT}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("item %d: %v, want %v", i, got[i], want[i])
		}
	}
	if r := resp.Responses[0]; r.Remaining != 98 {
		t.Errorf("per-minute remaining %d, want 98: the refused group charged it", r.Remaining)
	}
}
