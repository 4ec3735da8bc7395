package limiter

import "github.com/ringlimit/ringlimit/algorithms"

// DefaultMaxLogEntries is the default bound on the sliding-log entries a
// store holds: 160 MB of logs, at 16 bytes an entry.
const DefaultMaxLogEntries = 10_000_000

// logBudget bounds the memory of one table's variable-size states (sliding
// logs): --max-keys bounds the number of counters, but one full log takes
// algorithms.MaxSlidingLogLimit entries. Each shard's sliding-log table
// gets an even share of Config.MaxLogEntries; for the other tables both
// fields stay 0, as their states have a fixed size.
type logBudget struct {
	used int64 // entries the table's states have room for
	max  int64 // 0: no bound
}

// sized is a state whose memory varies: algorithms.SlidingLog.
type sized interface{ Cap() int }

// footprint returns the entries the state at idx has room for; 0 for a
// fixed-size state.
func (t *table[S, P]) footprint(idx int32) int64 {
	if s, ok := any(P(&t.entries[idx].state)).(sized); ok {
		return int64(s.Cap())
	}
	return 0
}

// settle accounts for the state at idx having grown or shrunk from before
// entries, and evicts the least recently used other counters of t while t
// holds more than its budget. It returns how many it evicted.
func (t *table[S, P]) settle(idx int32, before int64) int {
	t.logs.used += t.footprint(idx) - before
	evicted := 0
	for t.logs.max > 0 && t.logs.used > t.logs.max && t.tail >= 0 && t.tail != idx {
		t.evictOldest()
		evicted++
	}
	return evicted
}

// shareOfLogs is one shard's share of maxEntries among n shards, never
// less than one full log.
func shareOfLogs(maxEntries, n int) int64 {
	return int64(max(maxEntries/n, algorithms.MaxSlidingLogLimit))
}
