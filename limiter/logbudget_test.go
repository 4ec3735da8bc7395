package limiter

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringlimit/ringlimit/algorithms"
)

// fillLog takes a full log's worth of hits for key, one nanosecond apart,
// so that each is an entry of its own.
func fillLog(s *Store, key string, start time.Time) {
	for i := range algorithms.MaxSlidingLogLimit {
		s.Decide(&Request{Name: "api", Key: key, Algorithm: SlidingLog, Hits: 1, Now: start.Add(time.Duration(i)),
			Limit: algorithms.Limit{Count: algorithms.MaxSlidingLogLimit, Period: time.Hour}})
	}
}

// TestLogBudget is the attack of filling many sliding logs: --max-keys
// would let each of them take 160 KB; the store keeps the logs' entries
// within MaxLogEntries (and one decision's growth), and the heap stays
// near the budget. Full logs still charged are debts: the store refuses
// the growth of others (counted) rather than evict them, and once they
// are back to full it evicts them to make room.
func TestLogBudget(t *testing.T) {
	const budget = 5 * algorithms.MaxSlidingLogLimit // 800 KB of entries
	const keys = 50                                  // 8 MB of full logs
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := New(Config{MaxKeys: 1000, MaxLogEntries: budget}) // one shard
	for k := range keys {
		fillLog(s, fmt.Sprint("user:", k), t0.Add(time.Duration(k)*time.Second))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	logs := s.shards[0].tables[SlidingLog].(*table[algorithms.SlidingLog, *algorithms.SlidingLog])
	if most := int64(budget + algorithms.MaxSlidingLogLimit); s.logEntries.Load() > most {
		t.Errorf("logs hold %d entries, more than the budget and one log's growth, %d", s.logEntries.Load(), most)
	}
	var sum int64
	for idx := logs.head; idx >= 0; idx = logs.entries[idx].next {
		sum += logs.footprint(idx)
	}
	if sum != s.logEntries.Load() {
		t.Errorf("the logs' entries add up to %d, the budget counts %d", sum, s.logEntries.Load())
	}
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 3<<20 {
		t.Errorf("the heap grew by %d bytes for %d full logs within a budget of %d entries, want at most 3 MiB", grown, keys, budget)
	}
	if ev, ref := testutil.ToFloat64(s.metrics.logEvictions), testutil.ToFloat64(s.metrics.refused); ev != 0 || ref == 0 {
		t.Errorf("%v logs evicted, %v hits refused; want none evicted (all are debts) and some refused", ev, ref)
	}
	hourly := algorithms.Limit{Count: algorithms.MaxSlidingLogLimit, Period: time.Hour}
	// The first log filled, the least recently used, is whole: its next
	// hit is refused.
	first := Request{Name: "api", Key: "user:0", Algorithm: SlidingLog, Hits: 1, Now: t0.Add(keys * time.Second), Limit: hourly}
	if d := s.Decide(&first); d.Allowed {
		t.Errorf("the first full log admitted one more: it was forgiven: %+v", d)
	}
	// Two hours on, the logs are back to full: a new log makes room.
	fillLog(s, "late", t0.Add(2*time.Hour))
	late := Request{Name: "api", Key: "late", Algorithm: SlidingLog, Now: t0.Add(2 * time.Hour), Limit: hourly}
	if d := s.Check(&late); d.Remaining != 0 || testutil.ToFloat64(s.metrics.logEvictions) == 0 {
		t.Errorf("a log filled once the others were full again: %d remaining, %v logs evicted; want 0 and some",
			d.Remaining, testutil.ToFloat64(s.metrics.logEvictions))
	}
}

// TestLogBudgetAccounting checks that the budget counts what leaves the
// store: a reset, idle logs dropped, hand-off extraction, and a merge.
func TestLogBudgetAccounting(t *testing.T) {
	s := New(Config{MaxKeys: 1000})
	logs := s.shards[0].tables[SlidingLog].(*table[algorithms.SlidingLog, *algorithms.SlidingLog])
	l := algorithms.Limit{Count: 100, Period: time.Second}
	take := func(key string, at time.Duration, reset bool) {
		s.Decide(&Request{Name: "api", Key: key, Algorithm: SlidingLog, Hits: 1, Now: t0.Add(at), Limit: l, Reset: reset})
	}
	for i := range 10 {
		take("a", time.Duration(i), false)
		take("b", time.Duration(i), false)
	}
	used := s.logEntries.Load()
	if used == 0 {
		t.Fatal("ten hits take no log entries")
	}
	take("a", 10, true) // reset: a's log starts again with one entry
	if s.logEntries.Load() >= used {
		t.Errorf("after a reset: %d entries counted, want fewer than %d", s.logEntries.Load(), used)
	}
	out := slices.Collect(s.Extract(func(key string) bool { return key == "a" }))
	if len(out) != 1 {
		t.Fatalf("extracted %d counters, want 1", len(out))
	}
	take("a", 11, false) // a new counter for a, which the old one merges into
	if err := s.Merge(out[0], t0.Add(time.Second), time.Minute); err != nil {
		t.Fatal(err)
	}
	var sum int64
	for idx := logs.head; idx >= 0; idx = logs.entries[idx].next {
		sum += logs.footprint(idx)
	}
	if sum != s.logEntries.Load() {
		t.Errorf("after extract and merge: the logs' entries add up to %d, the budget counts %d", sum, s.logEntries.Load())
	}
	take("c", 2*time.Hour, false) // a and b are full again and dropped as idle
	sum = 0
	for idx := logs.head; idx >= 0; idx = logs.entries[idx].next {
		sum += logs.footprint(idx)
	}
	if sum != s.logEntries.Load() {
		t.Errorf("after idle logs were dropped: the logs' entries add up to %d, the budget counts %d", sum, s.logEntries.Load())
	}
}
