package limiter

import (
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// A store full of counters that still hold spent hits (debts) can neither
// forgive one to make room nor refuse every new key. So when it finds no
// counter back to full to evict, it evicts its least recently used counter
// anyway and keeps its debt: a seeded 64-bit hash of the counter's
// algorithm and id and the instant it is full again, DebtBytes each. The
// next check of that counter restores it (see owing). A shard's debts are
// a table of buckets of debtWays slots, each debt in the emptier of two,
// up to Config.MaxDebts in all; only when both are full of debts still
// owed is one forgiven, the one paid soonest (counted). See
// docs/design-store.md, "Debts of evicted counters".

// DebtBytes is what one debt of Config.MaxDebts takes in memory: a hash and
// an instant.
const DebtBytes = 16

// DefaultDebtsPerKey is how many debts a store keeps by default for each
// counter of Config.MaxKeys: eight, so that debts take at most about the
// memory the counters do.
const DefaultDebtsPerKey = 8

// debtWays is the number of slots of a bucket of debts: two buckets, 256
// bytes, are searched for a debt.
const debtWays = 8

// debt is one counter's debt: the seeded hash of its algorithm and id
// (debtHash; 0 marks a free slot) and the Unix ns it is back to full at.
type debt struct {
	hash  uint64
	until int64
}

// debts is one shard's debts: buckets of debtWays slots. The shard's lock
// guards it. Its zero value holds none, and takes no memory until a debt
// arrives.
type debts struct {
	slots []debt
	held  int // slots in use, some of which may have expired
	max   int // the most slots this shard may have (a multiple of debtWays)
}

// buckets returns the start of the two buckets of hash.
func (d *debts) buckets(hash uint64) (int, int) {
	n := uint64(len(d.slots) / debtWays)
	return int(uint64(uint32(hash))*n>>32) * debtWays, int((hash>>32)*n>>32) * debtWays
}

// owed returns the instant the debt under hash is paid, if it is owed
// still at now (Unix ns).
func (d *debts) owed(hash uint64, now int64) (int64, bool) {
	if d.held == 0 {
		return 0, false
	}
	a, b := d.buckets(hash)
	for _, start := range [2]int{a, b} {
		for i := start; i < start+debtWays; i++ {
			if s := d.slots[i]; s.hash == hash && s.until > now {
				return s.until, true
			}
		}
	}
	return 0, false
}

// forget drops the debt under hash, if any (a check that resets its
// counter forgets its state).
func (d *debts) forget(hash uint64) {
	if d.held == 0 {
		return
	}
	a, b := d.buckets(hash)
	for _, start := range [2]int{a, b} {
		for i := start; i < start+debtWays; i++ {
			if d.slots[i].hash == hash {
				d.slots[i] = debt{}
				d.held--
			}
		}
	}
}

// add keeps a debt under hash until until, at now, and reports whether
// it had to forgive another to find a slot for it (see the comment at the
// top of the file).
func (d *debts) add(hash uint64, until, now int64) (forgave bool) {
	if d.held >= len(d.slots)/2 && len(d.slots) < d.max {
		d.grow(now)
	}
	a, b := d.buckets(hash)
	free, freeIn := -1, debtWays+1
	soonest := -1
	for _, start := range [2]int{a, b} {
		used, firstFree := 0, -1
		for i := start; i < start+debtWays; i++ {
			s := d.slots[i]
			switch {
			case s.hash == hash:
				d.slots[i].until = max(s.until, until)
				return false
			case s.hash == 0 || s.until <= now:
				if firstFree < 0 {
					firstFree = i
				}
			default:
				used++
				if soonest < 0 || s.until < d.slots[soonest].until {
					soonest = i
				}
			}
		}
		if firstFree >= 0 && used < freeIn { // the emptier bucket
			free, freeIn = firstFree, used
		}
	}
	switch {
	case free >= 0:
		if d.slots[free].hash == 0 {
			d.held++
		}
	default:
		free, forgave = soonest, true
	}
	d.slots[free] = debt{hash: hash, until: until}
	return forgave
}

// grow doubles the slots, up to max, keeping the debts still owed at now.
func (d *debts) grow(now int64) {
	old := d.slots
	n := min(max(2*len(old), 16*debtWays), d.max)
	d.slots, d.held = make([]debt, n), 0
	for _, s := range old {
		if s.hash != 0 && s.until > now {
			d.add(s.hash, s.until, now)
		}
	}
}

// owing returns the state of a counter of t back to full at until under
// l that holds as many spent hits as such a state can: its capacity (what
// a counter at rest admits) taken at the instant that leaves it full at
// until. For a token bucket, GCRA and a leaky bucket, whose state is that
// instant, it is the state the counter had; for the windows, a log and a
// spacing, it holds at least what the counter held, so a debt restored
// never admits what the counter would have refused.
func (t *table[S, P]) owing(until int64, l algorithms.Limit) S {
	at := time.Unix(0, until)
	var probe, s S
	capacity := P(&probe).Check(at, l, 0).Remaining
	refill := P(&probe).Take(at, l, capacity).ResetAfter // from rest, as charged at until: how long the capacity takes to refill
	P(&s).Take(at.Add(-refill), l, capacity)
	return s
}

// restore makes the counter at idx, just inserted, the one a debt until
// until stands for (see owing), evaluated under l.
func (t *table[S, P]) restore(idx int32, until int64, l algorithms.Limit) {
	e := &t.entries[idx]
	before := t.footprint(idx)
	e.state = t.owing(until, l)
	t.setLimit(e, l)
	t.settle(idx, before)
}

// checkOwing answers a check of n hits under l at now (Unix ns) of a
// counter whose debt is owed until until, as its restored state would
// (see owing), charging nothing.
func (t *table[S, P]) checkOwing(until, now int64, l algorithms.Limit, n int64) algorithms.Decision {
	s := t.owing(until, l)
	return P(&s).Check(time.Unix(0, now), l, n)
}
