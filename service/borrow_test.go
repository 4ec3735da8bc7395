package service

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
)

// borrower is a check of name "api" for key that guarantees limit a
// period and borrows up to ceiling from the parent "all", which admits
// parent a period (parentPeriod, or the check's when 0).
func borrower(a pb.Algorithm, key string, limit, ceiling, parent int64, period, parentPeriod time.Duration) *pb.CheckItem {
	return &pb.CheckItem{Name: "api", Key: key, Algorithm: a, Limit: limit, DurationMs: period.Milliseconds(), Ceiling: ceiling,
		Parent: &pb.ParentLimit{Key: "all", Limit: parent, DurationMs: parentPeriod.Milliseconds()}}
}

// publicAlgorithms are the algorithms a check may name.
var publicAlgorithms = []pb.Algorithm{pb.Algorithm_TOKEN_BUCKET, pb.Algorithm_GCRA, pb.Algorithm_LEAKY_BUCKET,
	pb.Algorithm_FIXED_WINDOW, pb.Algorithm_SLIDING_WINDOW, pb.Algorithm_SLIDING_LOG}

// TestBorrowTimeline plays, on one node at one instant (nothing refills),
// two keys that each guarantee 4 an hour and may borrow up to 8 from a
// parent of 10, for every algorithm: the first key's guarantee, then its
// borrowing while the parent has room, then its ceiling; then the second
// key wakes up, and its guarantee is admitted although the first key
// borrowed the parent's room, which leaves nothing for it to borrow.
func TestBorrowTimeline(t *testing.T) {
	for _, alg := range publicAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			s := New(Config{Now: fixedClock(t0), Registerer: reg})
			a := borrower(alg, "a", 4, 8, 10, time.Hour, 0)
			b := borrower(alg, "b", 4, 8, 10, time.Hour, 0)
			peek := borrower(alg, "a", 4, 8, 10, time.Hour, 0)
			peek.Hits = hits(0)
			for i, st := range []struct {
				name     string
				item     *pb.CheckItem
				n        int
				status   pb.Status
				borrowed bool
			}{
				{"a's guarantee", a, 4, pb.Status_UNDER_LIMIT, false},
				{"a asks, charging nothing: its guarantee is spent", peek, 1, pb.Status_UNDER_LIMIT, false},
				{"a borrows the parent's room, up to its ceiling", a, 4, pb.Status_UNDER_LIMIT, true},
				{"a at its ceiling: refused, though the parent has 2 left", a, 1, pb.Status_OVER_LIMIT, false},
				{"b wakes up: its guarantee is admitted, the parent full or not", b, 4, pb.Status_UNDER_LIMIT, false},
				{"b beyond its guarantee: the parent has no room", b, 1, pb.Status_OVER_LIMIT, false},
			} {
				for range st.n {
					r := check(t, s, st.item)
					if r.Status != st.status || r.Borrowed != st.borrowed || r.Limit != 4 {
						t.Fatalf("step %d, %s: %v; want %v, borrowed %v, limit 4", i, st.name, r, st.status, st.borrowed)
					}
					if r.Status == pb.Status_OVER_LIMIT && r.RetryAfterMs <= 0 {
						t.Errorf("step %d, %s: refused with retry_after_ms %d, want a wait", i, st.name, r.RetryAfterMs)
					}
					if st.item == peek && r.Remaining != 0 {
						t.Errorf("step %d, %s: remaining %d, want 0: remaining is the guarantee's", i, st.name, r.Remaining)
					}
				}
			}
			for outcome, want := range map[string]float64{"borrowed": 4, "ceiling": 1, "parent_full": 1, "parent_unreachable": 0} {
				if got := metricSum(t, reg, "ringlimit_borrow_checks_total", "outcome", outcome); got != want {
					t.Errorf("ringlimit_borrow_checks_total{outcome=%q} = %v, want %v", outcome, got, want)
				}
			}
		})
	}
}

// TestBorrowCutBack plays two keys over time, for every algorithm: each
// guarantees 10 every 10s and may borrow up to 30 from a parent of 20
// every 10s, the sum of the two guarantees. Each asks every 100ms, far
// more than it may have. While the second key is idle, the first borrows
// the parent's room: about 20 a period, twice its guarantee. Once the
// second key wakes up, its guaranteed hits take the parent, and the first
// key is cut back to its own guarantee, never below it; together they
// have about the parent's 20.
func TestBorrowCutBack(t *testing.T) {
	const period, step = 10 * time.Second, 100 * time.Millisecond
	for _, alg := range publicAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			now := t0
			s := New(Config{Now: clockAt(&now)})
			a := borrower(alg, "a", 10, 30, 20, period, 0)
			b := borrower(alg, "b", 10, 30, 20, period, 0)
			// admitted[p][k] counts key k's admissions in period p; the
			// second key wakes at the start of period 4.
			var admitted [8][2]int64
			for at := time.Duration(0); at < 8*period; at += step {
				now = t0.Add(at)
				p := int(at / period)
				for k, item := range []*pb.CheckItem{a, b} {
					if k == 1 && p < 4 {
						continue
					}
					if r := check(t, s, item); r.Status == pb.Status_UNDER_LIMIT {
						admitted[p][k]++
					}
				}
			}
			t.Logf("admitted a period, [a b]: %v", admitted)
			for p := 1; p < 4; p++ { // the first key alone, past its first period
				if got := admitted[p][0]; got < 19 || got > 21 {
					t.Errorf("period %d, the first key alone: admitted %d, want about the parent's 20", p, got)
				}
			}
			for p := 5; p < 8; p++ { // both, past the second key's first period
				for k, got := range admitted[p] {
					if got < 9 || got > 11 {
						t.Errorf("period %d, both busy: key %d admitted %d, want about its guarantee of 10", p, k, got)
					}
				}
			}
		})
	}
}

// TestBorrowLeakyBucketDelay: a LEAKY_BUCKET check that borrows is given
// the delay of its ceiling's queue, which admitted it.
func TestBorrowLeakyBucketDelay(t *testing.T) {
	s := New(Config{Now: fixedClock(t0)})
	item := borrower(pb.Algorithm_LEAKY_BUCKET, "a", 2, 4, 100, time.Second, 0)
	var delays []int64
	for range 4 {
		r := check(t, s, item)
		delays = append(delays, r.DelayMs)
	}
	// The queue of the limit (2 a second: 500ms apart) for the guarantee,
	// then that of the ceiling (4 a second: 250ms apart), which holds all
	// four.
	if want := []int64{0, 500, 500, 750}; fmt.Sprint(delays) != fmt.Sprint(want) {
		t.Errorf("delays %v, want %v", delays, want)
	}
}

// TestBorrowReset: reset forgets the key's limit and ceiling, not the
// parent its guarantees were charged to.
func TestBorrowReset(t *testing.T) {
	s := New(Config{Now: fixedClock(t0)})
	a := borrower(pb.Algorithm_FIXED_WINDOW, "a", 4, 8, 10, time.Hour, 0)
	for range 8 {
		check(t, s, a) // 4 guaranteed, 4 borrowed: the parent has 2 left
	}
	reset := borrower(pb.Algorithm_FIXED_WINDOW, "a", 4, 8, 10, time.Hour, 0)
	reset.Reset_ = true
	if r := check(t, s, reset); r.Status != pb.Status_UNDER_LIMIT || r.Borrowed || r.Remaining != 3 {
		t.Errorf("reset: %v, want admitted from the guarantee, 3 remaining", r)
	}
	admitted := 0
	for range 10 {
		if check(t, s, a).Status == pb.Status_UNDER_LIMIT {
			admitted++
		}
	}
	if admitted != 3 {
		t.Errorf("after the reset: %d more admitted, want the 3 left of the guarantee and nothing borrowed: the parent, not reset, has no room left", admitted)
	}
}

// TestBorrowRefusedFields: a ceiling and a parent are checked as strictly
// as any field, and the error names the field at fault.
func TestBorrowRefusedFields(t *testing.T) {
	good := func() *pb.CheckItem { return borrower(pb.Algorithm_TOKEN_BUCKET, "a", 4, 8, 10, time.Minute, 0) }
	for _, tc := range []struct {
		field  string
		change func(*pb.CheckItem)
		all    bool
	}{
		{"ceiling", func(it *pb.CheckItem) { it.Ceiling = 0 }, false},
		{"parent", func(it *pb.CheckItem) { it.Parent = nil }, false},
		{"ceiling", func(it *pb.CheckItem) { it.Ceiling = 4 }, false},
		{"ceiling", func(it *pb.CheckItem) { it.Ceiling = -1 }, false},
		{"ceiling", func(it *pb.CheckItem) { it.Ceiling = checks.MaxLimit + 1 }, false},
		{"ceiling", func(it *pb.CheckItem) { it.Behavior = pb.Behavior_GLOBAL }, false},
		{"ceiling", func(it *pb.CheckItem) {
			it.Algorithm, it.Ceiling = pb.Algorithm_SLIDING_LOG, 10_001
		}, false},
		{"ceiling", func(it *pb.CheckItem) { it.Limit, it.DurationMs, it.MinIntervalMs = 0, 0, 1000 }, false},
		{"charge_refused", func(it *pb.CheckItem) { it.Algorithm, it.ChargeRefused = pb.Algorithm_FIXED_WINDOW, true }, false},
		{"ceiling", func(*pb.CheckItem) {}, true},
		{"parent.key", func(it *pb.CheckItem) { it.Parent.Key = "" }, false},
		{"parent.key", func(it *pb.CheckItem) { it.Parent.Key = string(make([]byte, checks.MaxParentKeyLen+1)) }, false},
		{"parent.limit", func(it *pb.CheckItem) { it.Parent.Limit = 0 }, false},
		{"parent.limit", func(it *pb.CheckItem) { it.Parent.Limit = checks.MaxLimit + 1 }, false},
		{"parent.limit", func(it *pb.CheckItem) {
			it.Algorithm, it.Parent.Limit = pb.Algorithm_SLIDING_LOG, 10_001
		}, false},
		{"parent.duration_ms", func(it *pb.CheckItem) { it.Parent.DurationMs = -1 }, false},
		{"parent.duration_ms", func(it *pb.CheckItem) { it.Parent.DurationMs = checks.MaxDuration.Milliseconds() + 1 }, false},
	} {
		item := good()
		tc.change(item)
		s := New(Config{Now: fixedClock(t0)})
		resp, err := s.Check(context.Background(), &pb.CheckRequest{All: tc.all, Requests: []*pb.CheckItem{item}})
		if err != nil {
			t.Fatal(err)
		}
		r := resp.Responses[0]
		if r.ErrorCode != pb.ErrorCode_INVALID_ARGUMENT || len(r.Error) < len(tc.field) || r.Error[:len(tc.field)+1] != tc.field+":" {
			t.Errorf("%v: %v, want INVALID_ARGUMENT naming %s", item, r, tc.field)
		}
		if s.store.Len() != 0 {
			t.Errorf("%v: the refused item left %d counters", item, s.store.Len())
		}
	}
}
