package limiter

import "sync/atomic"

// DefaultMaxLogEntries is the default bound on the sliding-log entries a
// store holds: 160 MB of logs, at 16 bytes an entry.
const DefaultMaxLogEntries = 10_000_000

// logBudget bounds the memory of variable-size states (sliding logs):
// --max-keys bounds the number of counters, but one full log takes
// algorithms.MaxSlidingLogLimit entries. Beyond the budget, logs back to
// full are evicted and, when none is, logs are not let grow (logRoom). The sliding-log table of every
// shard shares the store's count; for the other tables used is nil, as
// their states have a fixed size.
type logBudget struct {
	used    *atomic.Int64 // entries all the store's logs have room for
	max     int64
	evicted func(n int) // counts n logs evicted back to full (Store.evictedLogs)
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
// entries. It evicts nothing: a log grows only after logRoom made room,
// so the logs exceed the budget by at most one decision's growth a
// shard. Every decision calls it, so the case of a table outside the
// budget is an inlined comparison.
func (t *table[S, P]) settle(idx int32, before int64) {
	if t.logs.used != nil {
		t.logs.used.Add(t.footprint(idx) - before)
	}
}

// logRoom reports whether the log at idx (-1: a new one) may grow: true
// in a table outside the budget and while the logs hold no more than the
// budget; beyond it, it evicts logs of t back to full at now, which lose
// nothing (see evictFull), until they do, and reports false when it
// finds none: the logs that are left are debts, which the store never
// forgives to make room, so the growth is refused (ErrFull).
func (t *table[S, P]) logRoom(idx int32, now int64) bool {
	if t.logs.used == nil || t.logs.used.Load() <= t.logs.max {
		return true
	}
	evicted := 0
	defer func() {
		if evicted > 0 {
			t.logs.evicted(evicted)
		}
	}()
	for t.logs.used.Load() > t.logs.max {
		if !t.evictFull(now, evictScan, idx) {
			return false
		}
		evicted++
	}
	return true
}

// forget accounts for the state at idx leaving the store.
func (t *table[S, P]) forget(idx int32) {
	if t.logs.used != nil {
		t.logs.used.Add(-t.footprint(idx))
	}
}
