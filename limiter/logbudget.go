package limiter

import "sync/atomic"

// DefaultMaxLogEntries is the default bound on the sliding-log entries a
// store holds: 160 MB of logs, at 16 bytes an entry.
const DefaultMaxLogEntries = 10_000_000

// logBudget bounds the memory of variable-size states (sliding logs):
// --max-keys bounds the number of counters, but one full log takes
// algorithms.MaxSlidingLogLimit entries. The sliding-log table of every
// shard shares the store's count; for the other tables used is nil, as
// their states have a fixed size.
type logBudget struct {
	used    *atomic.Int64 // entries all the store's logs have room for
	max     int64
	evicted func(n int) // counts n logs evicted (Store.evictedLogs)
}

// sized is a state whose memory varies: algorithms.SlidingLog.
type sized interface{ Cap() int }

// footprint returns the entries the state at idx has room for; 0 for a
// fixed-size state, and in a table outside the budget, which holds only
// those: every decision asks, and the type assertion is not free.
func (t *table[S, P]) footprint(idx int32) int64 {
	if t.logs.used == nil {
		return 0
	}
	if s, ok := any(P(&t.entries[idx].state)).(sized); ok {
		return int64(s.Cap())
	}
	return 0
}

// settle accounts for the state at idx having grown or shrunk from before
// entries and, while the store's logs hold more than the budget, evicts
// the least recently used other counters of t, and counts them (the
// budget's evicted). Eviction stays within the shard whose lock is held,
// so the store may exceed the budget by what one shard's logs hold when
// the growing log is its only one: at most a full log a shard. Every
// decision calls it, so the case of a table outside the budget is an
// inlined comparison.
func (t *table[S, P]) settle(idx int32, before int64) {
	if t.logs.used != nil {
		t.settleLogs(idx, before)
	}
}

// settleLogs is settle in a table inside the budget.
func (t *table[S, P]) settleLogs(idx int32, before int64) {
	t.logs.used.Add(t.footprint(idx) - before)
	evicted := 0
	for t.logs.used.Load() > t.logs.max && t.tail >= 0 && t.tail != idx {
		t.evictOldest()
		evicted++
	}
	if evicted > 0 {
		t.logs.evicted(evicted)
	}
}

// forget accounts for the state at idx leaving the store.
func (t *table[S, P]) forget(idx int32) {
	if t.logs.used != nil {
		t.logs.used.Add(-t.footprint(idx))
	}
}
