package service

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
)

// clockAt returns a clock that reads *now, for timelines that move it.
func clockAt(now *time.Time) func() time.Time { return func() time.Time { return *now } }

// TestSpacedCheckTimeline plays a check of 100 a minute at least a second
// apart, and a spacing alone, on one node against t0: the answers' fields,
// retry_after_ms exact at the boundary (rounded up to the millisecond),
// a peek, a clock going back through created_at_ms, and reset.
func TestSpacedCheckTimeline(t *testing.T) {
	now := t0
	s := New(Config{Now: clockAt(&now)})
	const ms = time.Millisecond
	spaced := func(h int64) *pb.CheckItem {
		return &pb.CheckItem{Name: "api", Key: "u", Limit: 100, DurationMs: 60_000, MinIntervalMs: 1000, Hits: &h}
	}
	alone := func(h int64) *pb.CheckItem {
		return &pb.CheckItem{Name: "login", Key: "u", MinIntervalMs: 2000, Hits: &h}
	}
	at := func(d time.Duration) int64 { return t0.Add(d).UnixMilli() }
	for i, st := range []struct {
		name  string
		at    time.Duration
		item  *pb.CheckItem
		want  *pb.CheckResult
		setup func(*pb.CheckItem)
	}{
		{name: "admitted: the bucket is full in 600ms, the spacing allows again in 1s", item: spaced(1),
			want: &pb.CheckResult{Limit: 100, Remaining: 99, ResetTimeMs: at(time.Second)}},
		{name: "400ms later: refused for the 600ms left, the limit not charged", at: 400 * ms, item: spaced(1),
			want: &pb.CheckResult{Status: pb.Status_OVER_LIMIT, Limit: 100, Remaining: 99, ResetTimeMs: at(time.Second), RetryAfterMs: 600}},
		{name: "a nanosecond early: refused for 1ms, rounded up", at: time.Second - 1, item: spaced(1),
			want: &pb.CheckResult{Status: pb.Status_OVER_LIMIT, Limit: 100, Remaining: 100, ResetTimeMs: at(time.Second), RetryAfterMs: 1}},
		{name: "at the boundary: admitted", at: time.Second, item: spaced(1),
			want: &pb.CheckResult{Limit: 100, Remaining: 99, ResetTimeMs: at(2 * time.Second)}},
		{name: "a peek is answered, charges nothing", at: time.Second, item: spaced(0),
			want: &pb.CheckResult{Limit: 100, Remaining: 99, ResetTimeMs: at(2 * time.Second)}},
		// (reset_time_ms is not checked here: it is counted from
		// created_at_ms, as for any check evaluated at a later time.)
		{name: "created_at_ms earlier than the last check: the wait counts from the latest time", at: 1500 * ms, item: spaced(1),
			setup: func(it *pb.CheckItem) { it.CreatedAtMs = at(500 * ms) },
			want:  &pb.CheckResult{Status: pb.Status_OVER_LIMIT, Limit: 100, Remaining: 99, ResetTimeMs: -1, RetryAfterMs: 1000}},
		{name: "reset forgets the limit and the spacing", at: 1500 * ms, item: spaced(1),
			setup: func(it *pb.CheckItem) { it.Reset_ = true },
			want:  &pb.CheckResult{Limit: 100, Remaining: 99, ResetTimeMs: at(2500 * ms)}},
		{name: "a spacing alone at rest: one request is left", at: 1500 * ms, item: alone(0),
			want: &pb.CheckResult{Limit: 1, Remaining: 1, ResetTimeMs: at(1500 * ms)}},
		{name: "a spacing alone: admitted", at: 1500 * ms, item: alone(1),
			want: &pb.CheckResult{Limit: 1, Remaining: 0, ResetTimeMs: at(3500 * ms)}},
		{name: "a spacing alone: refused until 2s after", at: 2 * time.Second, item: alone(1),
			want: &pb.CheckResult{Status: pb.Status_OVER_LIMIT, Limit: 1, Remaining: 0, ResetTimeMs: at(3500 * ms), RetryAfterMs: 1500}},
		{name: "a spacing alone keeps its own counter: the limit's spacing is apart", at: 2500 * ms, item: spaced(1),
			want: &pb.CheckResult{Limit: 100, Remaining: 99, ResetTimeMs: at(3500 * ms)}},
	} {
		now = t0.Add(st.at)
		if st.setup != nil {
			st.setup(st.item)
		}
		r := check(t, s, st.item)
		w := st.want
		if r.Status != w.Status || r.Limit != w.Limit || r.Remaining != w.Remaining || (w.ResetTimeMs >= 0 && r.ResetTimeMs != w.ResetTimeMs) ||
			r.RetryAfterMs != w.RetryAfterMs || r.DelayMs != 0 {
			t.Errorf("step %d, %s:\n got %v\nwant %v", i, st.name, r, w)
		}
	}
}

// TestSpacedAllGroups: with "all", the spacing of a check is a member of
// its key's group: a refusal by the spacing refuses the group, charges
// none of it, and gives every check the spacing's wait; another key's
// group is decided apart.
func TestSpacedAllGroups(t *testing.T) {
	now := t0
	s := New(Config{Now: clockAt(&now)})
	req := &pb.CheckRequest{All: true, Requests: []*pb.CheckItem{
		{Name: "per-minute", Key: "user:1", Limit: 100, DurationMs: 60_000, MinIntervalMs: 1000},
		{Name: "per-second", Key: "user:1", Limit: 10, DurationMs: 1000, Algorithm: pb.Algorithm_SLIDING_WINDOW},
		{Name: "per-second", Key: "user:2", Limit: 10, DurationMs: 1000, MinIntervalMs: 1000},
	}}
	resp, _ := s.Check(context.Background(), req)
	for i, r := range resp.Responses {
		if r.Status != pb.Status_UNDER_LIMIT {
			t.Fatalf("first: item %d %v, want every one admitted", i, r)
		}
	}
	now = t0.Add(300 * time.Millisecond)
	req.Requests[2].Key = "user:3" // a fresh key: its group is admitted
	resp, _ = s.Check(context.Background(), req)
	for i, want := range []struct {
		status pb.Status
		retry  int64
	}{{pb.Status_OVER_LIMIT, 700}, {pb.Status_OVER_LIMIT, 700}, {pb.Status_UNDER_LIMIT, 0}} {
		if r := resp.Responses[i]; r.Status != want.status || r.RetryAfterMs != want.retry {
			t.Errorf("300ms later, item %d: %v, want %v with retry_after_ms %d", i, r, want.status, want.retry)
		}
	}
	if r := resp.Responses[1]; r.Remaining != 9 {
		t.Errorf("per-second after the refused group: %d remaining, want 9: only the first request charged it", r.Remaining)
	}
}

// TestSpacedCheckForwarded: a spaced check sent to any node of three is
// forwarded whole to its key's owner, which keeps the spacing: of checks
// through every node at one instant exactly one is admitted, and the
// non-owners hold no counter.
func TestSpacedCheckForwarded(t *testing.T) {
	now := t0
	c, svcs := newFakeClusterWith(3, func(int) Config { return Config{Now: clockAt(&now)} })
	for _, b := range []pb.Behavior{pb.Behavior_BATCHED, pb.Behavior_UNBATCHED} {
		item := &pb.CheckItem{Name: "api-" + b.String(), Key: c.keyOwnedBy(2), Limit: 1000, DurationMs: 60_000, MinIntervalMs: 250, Behavior: b}
		for round := range 4 {
			now = t0.Add(time.Duration(round) * 250 * time.Millisecond)
			admitted := 0
			for i := range 9 {
				r := check(t, svcs[i%3], item)
				if r.Status == pb.Status_UNDER_LIMIT {
					admitted++
				} else if r.RetryAfterMs != 250 {
					t.Errorf("%v round %d check %d: %v, want refused for the 250ms of the spacing", b, round, i, r)
				}
			}
			if admitted != 1 {
				t.Errorf("%v round %d: %d of 9 admitted over 3 nodes, want exactly 1", b, round, admitted)
			}
		}
	}
	if n := svcs[0].store.Len() + svcs[1].store.Len(); n != 0 {
		t.Errorf("non-owners hold %d counters, want 0", n)
	}
	if n := svcs[2].store.Len(); n != 4 {
		t.Errorf("the owner holds %d counters, want 4: two limits and their spacings", n)
	}
}

// TestSpacedFallback: with the owner and the key's heir unreachable, a
// node decides a spaced check with its share: the interval times the
// members, so that the nodes together admit about one request an interval.
func TestSpacedFallback(t *testing.T) {
	now := t0
	c, svcs := newFakeClusterWith(3, func(int) Config { return Config{Now: clockAt(&now)} })
	c.down["peer-2"], c.down["peer-1"] = true, true
	key := c.keyInheritedBy(2, 1)
	for _, item := range []*pb.CheckItem{
		{Name: "spaced", Key: key, Limit: 300, DurationMs: 60_000, MinIntervalMs: 100},
		{Name: "alone", Key: key, MinIntervalMs: 100},
	} {
		for _, st := range []struct {
			at    time.Duration
			ok    bool
			retry int64
		}{{0, true, 0}, {100 * time.Millisecond, false, 200}, {299 * time.Millisecond, false, 1}, {300 * time.Millisecond, true, 0}} {
			now = t0.Add(st.at)
			r := check(t, svcs[0], item)
			if r.Metadata[MetadataDecidedBy] != routeFallback.String() || (r.Status == pb.Status_UNDER_LIMIT) != st.ok || r.RetryAfterMs != st.retry {
				t.Errorf("%s at %v: %v; want decided by fallback, admitted %v, retry_after_ms %d (a spacing of 3 x 100ms)",
					item.Name, st.at, r, st.ok, st.retry)
			}
		}
	}
}

// TestSpacedFailover: the owner replicates a key's spacing with its limit;
// with the owner unreachable the key's heir decides on both, so the
// spacing goes on where it was, with the whole interval.
func TestSpacedFailover(t *testing.T) {
	now := t0
	c, svcs := newFakeClusterWith(3, func(int) Config { return Config{Now: clockAt(&now)} })
	item := &pb.CheckItem{Name: "api", Key: c.keyInheritedBy(2, 1), Limit: 10, DurationMs: 60_000, MinIntervalMs: 1000}
	if r := check(t, svcs[0], item); r.Status != pb.Status_UNDER_LIMIT {
		t.Fatalf("first: %v", r)
	}
	if sent := svcs[2].custody.Replicate(t.Context()); sent != 2 {
		t.Fatalf("node-2 replicated %d counters, want the limit and its spacing", sent)
	}
	c.down["peer-2"] = true
	now = t0.Add(400 * time.Millisecond)
	r := check(t, svcs[0], item)
	if r.Metadata[MetadataDecidedBy] != routeFailover || r.Status != pb.Status_OVER_LIMIT || r.RetryAfterMs != 600 || r.Remaining != 9 {
		t.Errorf("400ms later, the owner down: %v; want refused by the heir for the 600ms left, 9 remaining", r)
	}
	now = t0.Add(time.Second)
	if r := check(t, svcs[0], item); r.Status != pb.Status_UNDER_LIMIT || r.Remaining != 8 {
		t.Errorf("a second later: %v; want admitted, 8 remaining", r)
	}
}

// TestSpacingRefusedWithGlobal: GLOBAL answers from each node's grant, so
// it cannot keep a spacing: the combination is the item's own error.
func TestSpacingRefusedWithGlobal(t *testing.T) {
	s := New(Config{Now: fixedClock(t0)})
	for _, item := range []*pb.CheckItem{
		{Name: "api", Key: "k", Limit: 10, DurationMs: 1000, MinIntervalMs: 100, Behavior: pb.Behavior_GLOBAL},
		{Name: "api", Key: "k", MinIntervalMs: 100, Behavior: pb.Behavior_GLOBAL},
	} {
		resp, _ := s.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
		if r := resp.Responses[0]; r.ErrorCode != pb.ErrorCode_INVALID_ARGUMENT || r.Error != "min_interval_ms: not with GLOBAL behavior: a spacing is decided by the key's owner (use BATCHED or UNBATCHED)" {
			t.Errorf("%v: %v, want an error naming min_interval_ms", item, r)
		}
	}
}

// TestSpacingMetrics: a spacing alone is counted under algorithm SPACING;
// a spaced check under its own algorithm, refused or not.
func TestSpacingMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := New(Config{Now: fixedClock(t0), Registerer: reg})
	for range 2 {
		check(t, s, &pb.CheckItem{Name: "login", Key: "u", MinIntervalMs: 1000})
		check(t, s, &pb.CheckItem{Name: "api", Key: "u", Limit: 10, DurationMs: 1000, Algorithm: pb.Algorithm_GCRA, MinIntervalMs: 1000})
	}
	for _, c := range []struct {
		algorithm, status string
		want              float64
	}{
		{"SPACING", "UNDER_LIMIT", 1}, {"SPACING", "OVER_LIMIT", 1}, {"GCRA", "UNDER_LIMIT", 1}, {"GCRA", "OVER_LIMIT", 1},
	} {
		if got := metricSum(t, reg, "ringlimit_checks_total", "algorithm", c.algorithm, "status", c.status); got != c.want {
			t.Errorf("checks{algorithm=%s, status=%s} = %v, want %v", c.algorithm, c.status, got, c.want)
		}
	}
}

// TestPeerAttackCraftedSpacing: spacing counters handed off or replicated
// are checked as strictly as any: one a check could make is taken; one
// whose Next is further than its interval past now, whose limit is not one
// request a period, or whose period is not whole milliseconds or longer
// than a year, is refused as INVALID and changes nothing.
func TestPeerAttackCraftedSpacing(t *testing.T) {
	for rpc, send := range counterRPCs {
		t.Run(rpc, func(t *testing.T) {
			c, svcs := newFakeCluster(2)
			client := servePeer(t, svcs[0], nil)
			key := c.keyOwnedBy(0)
			now := t0.UnixNano()
			second := limiter.SpacingLimit(time.Second)
			year := 365 * 24 * time.Hour
			spacing := func(next int64) []byte { return encoded(&algorithms.Spacing{Next: next}) }
			good := record(limiter.Spacing, "api", key, second, now, spacing(now+int64(time.Second)))
			bad := [][]byte{
				record(limiter.Spacing, "api", key, second, now, spacing(now+int64(time.Hour))),
				record(limiter.Spacing, "api", key, second, now, spacing(-1)),
				record(limiter.Spacing, "api", key, algorithms.Limit{Count: 2, Period: time.Second}, now, spacing(now)),
				record(limiter.Spacing, "api", key, algorithms.Limit{Count: 1, Period: time.Second, Burst: 1}, now, spacing(now)),
				record(limiter.Spacing, "api", key, limiter.SpacingLimit(1500*time.Microsecond), now, spacing(now)),
				record(limiter.Spacing, "api", key, limiter.SpacingLimit(year+time.Millisecond), now, spacing(now)),
				record(limiter.Spacing, "api", key, second, now, encoded(&algorithms.GCRA{TAT: now})),
				record(limiter.Algorithm(limiter.NumAlgorithms), "api", key, second, now, spacing(now)),
			}
			counters := []*peerpb.CounterState{{Counter: good}}
			for _, b := range bad {
				counters = append(counters, &peerpb.CounterState{Counter: b})
			}
			accepted, refused := send(t, client, "node-1", counters)
			if accepted != 1 || len(refused) != len(bad) {
				t.Fatalf("accepted %d, refused %d; want the good spacing taken and the %d crafted ones refused", accepted, len(refused), len(bad))
			}
			for _, r := range refused {
				if r.GetIndex() == 0 || r.GetReason() != peerpb.Refusal_INVALID || r.GetDetail() == "" {
					t.Errorf("counter %d refused as %v (%q), want a crafted one refused as INVALID with a reason", r.GetIndex(), r.GetReason(), r.GetDetail())
				}
			}
		})
	}
}

// TestPeerAttackForwardSpacing: a forwarded item's min_interval_ms is
// validated as a public check's is.
func TestPeerAttackForwardSpacing(t *testing.T) {
	_, svcs := newFakeCluster(2)
	client := servePeer(t, svcs[0], nil)
	bad := []*pb.CheckItem{
		{Name: "api", Key: "k", Limit: 10, DurationMs: 1000, MinIntervalMs: -1},
		{Name: "api", Key: "k", Limit: 10, DurationMs: 1000, MinIntervalMs: 1 << 62},
		{Name: "api", Key: "k", MinIntervalMs: 1000, Behavior: pb.Behavior_GLOBAL},
		{Name: "api", Key: "k", MinIntervalMs: 1000, Burst: 5},
		{Name: "api", Key: "k", Algorithm: pb.Algorithm(limiter.Spacing), Limit: 1, DurationMs: 1000},
	}
	resp, err := client.Forward(t.Context(), &peerpb.ForwardRequest{Requests: []*pb.CheckRequest{{Requests: bad}}})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range resp.GetResponses()[0].GetResponses() {
		if r.GetErrorCode() != pb.ErrorCode_INVALID_ARGUMENT {
			t.Errorf("item %d answered %v, want an INVALID_ARGUMENT error", i, r)
		}
	}
	if n := svcs[0].store.Len(); n != 0 {
		t.Errorf("the owner holds %d counters after a forward of invalid items, want 0", n)
	}
}

// TestSpacingShare: a member's share of a spacing is members times it,
// at most a year.
func TestSpacingShare(t *testing.T) {
	for _, c := range []struct {
		d       time.Duration
		members int64
		want    time.Duration
	}{
		{0, 3, 0}, {time.Second, 1, time.Second}, {time.Second, 3, 3 * time.Second},
		{checks.MaxDuration / 2, 3, checks.MaxDuration}, {checks.MaxDuration, 1 << 40, checks.MaxDuration},
	} {
		if got := spacingShare(c.d, c.members); got != c.want {
			t.Errorf("spacingShare(%v, %d) = %v, want %v", c.d, c.members, got, c.want)
		}
	}
}

// TestPoisonedSpacing: a hostile check spacing a key a year apart holds
// the application's own spaced checks of that name and key for at most
// their own interval: their first check clamps the spacing to it.
func TestPoisonedSpacing(t *testing.T) {
	now := t0
	s := New(Config{Now: clockAt(&now)})
	check(t, s, &pb.CheckItem{Name: "api", Key: "user:1", MinIntervalMs: checks.MaxDuration.Milliseconds()})
	app := &pb.CheckItem{Name: "api", Key: "user:1", MinIntervalMs: 1000}
	if r := check(t, s, app); r.Status != pb.Status_OVER_LIMIT || r.RetryAfterMs != 1000 {
		t.Errorf("the application's check after a year's spacing: %v, want refused for its own 1s", r)
	}
	now = t0.Add(time.Second)
	if r := check(t, s, app); r.Status != pb.Status_UNDER_LIMIT {
		t.Errorf("a second later: %v, want admitted", r)
	}
}
