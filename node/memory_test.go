package node

import (
	"testing"

	"github.com/ringlimit/ringlimit/algorithms"
)

// TestSplitMemory: --memory-limit is divided into its stated shares, no
// share raises a count the flags set, and without a limit only the
// counts bound the node.
func TestSplitMemory(t *testing.T) {
	conf := DefaultConfig()
	const limit = 200 << 20
	m := splitMemory(limit, conf)
	for _, c := range []struct {
		name    string
		percent int64
		got     int64
	}{
		{"counters", counterShare, m.counters.MaxBytes + int64(m.counters.MaxLogEntries)*algorithms.LogEntryBytes},
		{"replicas", replicaShare, m.replicas.MaxBytes + int64(m.replicas.MaxLogEntries)*algorithms.LogEntryBytes},
		{"requests", requestShare, m.requests},
	} {
		if want := int64(limit) / 100 * c.percent; c.got != want {
			t.Errorf("%s: %d bytes, want %d%% of the limit, %d", c.name, c.got, c.percent, want)
		}
	}
	if m.counters.MaxKeys != conf.MaxKeys || m.counters.MaxLogEntries > conf.MaxLogEntries || m.counters.MaxLogEntries < algorithms.MaxSlidingLogLimit {
		t.Errorf("counters: %+v, want --max-keys kept and logs within --max-log-entries and one full log", m.counters)
	}
	if counterShare+replicaShare+requestShare > 70 {
		t.Errorf("the shares add up to %d%%, leaving the runtime less than 30%%", counterShare+replicaShare+requestShare)
	}
	if none := splitMemory(0, conf); none.counters.MaxBytes != 0 || none.requests != 0 || none.counters.MaxLogEntries != conf.MaxLogEntries {
		t.Errorf("no limit: %+v, want only the counts", none)
	}
}
