package node

import (
	"testing"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/limiter"
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
		{"counters", counterShare, storeBytes(m.counters)},
		{"replicas", replicaShare, storeBytes(m.replicas)},
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
	if m.counters.MaxReservations > conf.MaxReservations || m.counters.MaxReservations < 1 || m.counters.MaxDebts < 1 {
		t.Errorf("counters: %+v, want reservations within --max-reservations and room for a debt and a reservation", m.counters)
	}
	if none := splitMemory(0, conf); none.counters.MaxBytes != 0 || none.requests != 0 || none.counters.MaxLogEntries != conf.MaxLogEntries {
		t.Errorf("no limit: %+v, want only the counts", none)
	}
}

// storeBytes is what a store of conf holds at most, by its byte bounds:
// counters, sliding-log entries, debts and reservations.
func storeBytes(conf limiter.Config) int64 {
	return conf.MaxBytes + int64(conf.MaxLogEntries)*algorithms.LogEntryBytes + int64(conf.MaxDebts)*limiter.DebtBytes +
		int64(conf.MaxReservations)*limiter.ReservationMemory
}
