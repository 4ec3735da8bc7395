package node

import (
	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/global"
	"github.com/ringlimit/ringlimit/limiter"
)

// The shares of Config.MemoryLimit, in percent, that bound what a node
// holds. What they leave, 31%, is the runtime's headroom: garbage between
// collections (the limit is also the Go runtime's soft limit, so the
// collector runs harder as the heap nears it), goroutine stacks,
// connection and gossip buffers, peer messages in flight (forwards,
// hand-off and replication batches: bounded apart, by the peer server's
// fixed 256 MiB budget of decoded requests, which does not shrink with
// the limit) and snapshots being written, none of which is counted.
const (
	// counterShare bounds this node's own counters: a quarter of it their
	// sliding-log entries, an eighth the debts of counters evicted owing
	// (limiter.Config.MaxDebts), an eighth their reservations
	// (MaxReservations), the rest the counters (MaxBytes).
	counterShare = 30
	// replicaShare bounds the replicas this node keeps of other owners'
	// counters (the store that hand-off and replication fill), split as
	// counterShare is.
	replicaShare = 10
	// requestShare bounds the client requests in flight: HTTP checks at
	// admit.RequestBytes of their body, gRPC calls at
	// admit.ArrivalBytes until their message has arrived and then, as
	// the requests of CheckStreams, at admit.RequestBytes of its size.
	requestShare = 25
	// leaseShare bounds the lessees' and Envoy streams' state: half of it
	// the lessee accounts this node holds as owner
	// (global.LeaseConfig.MaxAccounts), half the quota streams' buckets
	// and reports (rlqs.Config.MaxBytes).
	leaseShare = 4
)

// memory is what Config.MemoryLimit allows each part; zero fields mean
// no bound but the counts of Config.
type memory struct {
	counters, replicas limiter.Config // MaxBytes and MaxLogEntries
	requests           int64          // admit.Config.MaxBytes
	leaseAccounts      int            // global.LeaseConfig.MaxAccounts
	quotas             int64          // rlqs.Config.MaxBytes
}

// splitMemory divides limit (0: none) into the shares above, each bound
// no looser than what conf's counts already allow: a share never raises
// --max-keys, --max-log-entries or --max-reservations, a store's logs
// always have room for one full log, and its reservations for one.
func splitMemory(limit int64, conf Config) memory {
	if limit <= 0 {
		counts := limiter.Config{MaxKeys: conf.MaxKeys, MaxLogEntries: conf.MaxLogEntries, MaxReservations: conf.MaxReservations}
		return memory{counters: counts, replicas: counts}
	}
	// A sliding-log entry takes in memory what it takes encoded: two
	// int64s.
	store := func(percent int64) limiter.Config {
		share := limit / 100 * percent
		logs := min(int64(conf.MaxLogEntries), max(share/4/algorithms.LogEntryBytes, algorithms.MaxSlidingLogLimit))
		debts := min(int64(limiter.DefaultDebtsPerKey*conf.MaxKeys), share/8/limiter.DebtBytes)
		reservations := max(min(int64(conf.MaxReservations), share/8/limiter.ReservationMemory), 1)
		return limiter.Config{MaxKeys: conf.MaxKeys, MaxLogEntries: int(logs), MaxDebts: int(debts), MaxReservations: int(reservations),
			MaxBytes: share - logs*algorithms.LogEntryBytes - debts*limiter.DebtBytes - reservations*limiter.ReservationMemory}
	}
	lease := limit / 100 * leaseShare
	return memory{counters: store(counterShare), replicas: store(replicaShare), requests: limit / 100 * requestShare,
		leaseAccounts: int(max(1, lease/2/global.AccountBytes)), quotas: lease / 2}
}
