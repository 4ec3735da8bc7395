// Package strict is strict mode: never more than the limit, in any
// partition or crash, at the cost of refusals (decided_by "escrow").
//
// With a quorum set on every node (service.Config.StrictQuorum), a key is
// decided only where no other node can be deciding it at the same time:
// by its owner, while its ring holds a quorum. A check whose owner cannot
// be reached is decided from this node's escrow (its GLOBAL grant) or
// refused. The keys of a member that left the ring without its last word
// are fenced for StrictFence, then their counters counted spent once
// (Mode.Judge); a member that leaves gracefully sends its last word once
// it holds nothing (Mode.TakeLeft), and its keys are decided at once, but
// for GLOBAL ones and ceilings. The rules: docs/strict.md; why a fence and
// what a last word proves: docs/design-cluster.md, "Strict mode: why a
// fence, and what a last word proves".
package strict

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/global"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// DefaultFence is the default fence (service.Config.StrictFence): memberlist's
// verdict on a cut-off member (about 5 s, on the same timers on both sides
// of a split), with room for the two sides' verdicts to differ by as much
// again, the escrow time-to-live and a lessee's (2 s by default).
const DefaultFence = 15 * time.Second

// DefaultEscrowTTL is how long a node spends a GLOBAL grant in strict mode
// after the owner last renewed it: ten rounds of the default --global-sync.
// With a longer --global-sync it is ten rounds (EscrowTTL), so that a busy
// key's grant is renewed many times in its life.
const DefaultEscrowTTL = time.Second

// EscrowTTL is the escrow time-to-live, in strict mode, of a cluster whose
// GLOBAL rounds are sync apart (zero: global.DefaultInterval).
func EscrowTTL(sync time.Duration) time.Duration {
	if sync <= 0 {
		sync = global.DefaultInterval
	}
	return max(DefaultEscrowTTL, 10*sync)
}

// maxDrops bounds the departures strict mode remembers; the oldest is
// forgotten first (a cluster losing members this often has no quorum).
const maxDrops = 64

// maxCharged bounds the counters the departures remember having charged,
// together (about 100 bytes each); beyond it, a counter is charged at every
// check until its window ends: more refusals, never more admissions.
const maxCharged = 1 << 18

// Mode is a node's strict mode: its settings, and the members that left
// the ring lately. The zero value is off. It is safe for
// concurrent use: checks read the departures without a lock (an immutable
// slice, replaced on each ring change), and lock only to mark a charge.
type Mode struct {
	quorum int
	fence  time.Duration
	drops  atomic.Pointer[[]*drop] // oldest first
	mu     sync.Mutex              // serializes RingChanged, and guards every drop's charged and charged
	// last is the ring of the last RingChanged, written under mu; checks
	// read it without a lock (see Judge).
	last atomic.Pointer[ring.Ring]
	// charged is the size of the drops' charged maps, together.
	charged int
}

// drop is a member that left the ring: the ring that still had it, the
// ID of the ring that dropped it, when it left, the counters charged since
// on its behalf, and whether it said it left (TakeLeft).
type drop struct {
	name    string
	before  *ring.Ring
	after   uint64
	at      time.Time
	charged map[counterID]struct{}
	left    atomic.Bool
}

// counterID names a counter without its limit.
type counterID struct {
	name, key string
	alg       limiter.Algorithm
	role      limiter.Role
}

// On reports whether strict mode is on.
func (m *Mode) On() bool { return m.quorum > 0 }

// RingChanged records the members of the last ring that r lacks, but self,
// as departed at now.
func (m *Mode) RingChanged(r *ring.Ring, self string, now time.Time) {
	if !m.On() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if last := m.last.Load(); last != nil {
		var drops []*drop
		if old := m.drops.Load(); old != nil {
			drops = *old
		}
		for _, mem := range last.Members() {
			if mem.Name != self && !r.Has(mem.Name) {
				first := max(0, len(drops)-maxDrops+1)
				for _, old := range drops[:first] {
					m.charged -= len(old.charged)
				}
				drops = append(drops[first:len(drops):len(drops)],
					&drop{name: mem.Name, before: last, after: r.ID(), at: now, charged: map[counterID]struct{}{}})
			}
		}
		m.drops.Store(&drops)
	}
	m.last.Store(r)
}

// TakeLeft takes member from's last word that it has left, holding no
// counter of the keys this node owns in the ring whose ID is id (see "A
// graceful leave"): the keys this node took over from it are decided at
// once from now on. It returns an error, and takes nothing, unless the
// ring lacks from and this node's latest departure of from dropped it
// into that ring, within the fence before now (later, the fence has
// passed: a word would spare nothing but the charge, and this node does
// not take one that late). With strict mode off there is nothing to take.
func (m *Mode) TakeLeft(from string, id uint64, now time.Time) error {
	if !m.On() {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if last := m.last.Load(); last == nil || last.Has(from) {
		return fmt.Errorf("%q is in this node's ring still", from)
	}
	if drops := m.drops.Load(); drops != nil {
		for _, d := range slices.Backward(*drops) {
			if d.name != from {
				continue
			}
			if d.after != id {
				return fmt.Errorf("%q left ring %016x; this node's ring dropped it into %016x", from, id, d.after)
			}
			if now.Sub(d.at) >= m.fence {
				return fmt.Errorf("%q left %v ago, past the fence", from, now.Sub(d.at))
			}
			d.left.Store(true)
			return nil
		}
	}
	return fmt.Errorf("no departure of %q remembered", from)
}

// A Verdict is what strict mode says of a check this node would decide as
// its key's owner.
type Verdict uint8

const (
	Decide Verdict = iota // decide it
	Charge                // count its counter as spent first, then decide it
	Refuse                // refuse it: no quorum, or its key's last owner may still be deciding it
)

// Judge returns the verdict on r, decided here, by self, at now as the
// owner of its key in cur, or as the holder of the key's counter that cur
// gives to another member (see custody's settle); holds reports whether
// this node holds a check's counter (nil: never); keepFence says a
// departure that said it left still fences r (GLOBAL, or a ceiling). A
// Charge is given once per counter and departure. A counter this node
// holds, as heir, of a member that came back may be a stale copy (a
// promoted replica): checks of its key are refused until it has gone to
// the member, within the fence and the counter's refill.
func (m *Mode) Judge(r *limiter.Request, keepFence bool, cur *ring.Ring, self string, holds func(*limiter.Request) bool, now time.Time) Verdict {
	if cur.Len() < m.quorum {
		return Refuse
	}
	if last := m.last.Load(); last != nil && last != cur {
		// The cluster stores a new ring, then calls RingChanged: until
		// then a check may be decided by a ring whose departures are not
		// recorded yet. A key whose owner is one of them has just lost it,
		// and is fenced as if recorded.
		if owner, ok := last.Owner(r.Key); ok && owner.Name != self && !cur.Has(owner.Name) {
			return Refuse
		}
	}
	drops := m.drops.Load()
	if drops == nil {
		return Decide
	}
	var due []*drop // the departures that may still owe r's counter its charge
	for _, d := range *drops {
		if now.Sub(d.at) >= m.fence+refillTime(r.Limit) || (!keepFence && d.left.Load()) {
			continue // the counter has refilled since it could last decide; or it left, its counters here
		}
		if cur.Has(d.name) {
			if owner, _ := cur.Owner(r.Key); owner.Name == d.name && holds != nil && holds(r) {
				return Refuse // back, and the counter here may be a stale copy of its own
			}
			continue // back, and owns its keys again
		}
		if owner, _ := d.before.Owner(r.Key); owner.Name != d.name {
			continue
		}
		if now.Sub(d.at) < m.fence {
			return Refuse
		}
		due = append(due, d)
	}
	if len(due) == 0 {
		return Decide
	}
	id := counterID{r.Name, r.Key, r.Algorithm, r.Role}
	v := Decide
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range due {
		if _, done := d.charged[id]; done {
			continue
		}
		if m.charged < maxCharged {
			d.charged[id] = struct{}{}
			m.charged++
		}
		v = Charge
	}
	return v
}

// refillTime is how long a counter of l takes, from spent, to admit its
// whole capacity again, rounded up: a window (two, for a sliding window's
// weighted previous one), or a bucket's capacity at its rate.
func refillTime(l algorithms.Limit) time.Duration {
	n := max(2, (l.Capacity()+l.Count-1)/max(1, l.Count))
	if l.Period > time.Duration(1<<62)/time.Duration(n) {
		return time.Duration(1 << 62)
	}
	return l.Period * time.Duration(n)
}

// New returns the strict mode of a node that decides keys only while its
// ring holds at least quorum members, and fences a departed member's keys
// for fence (zero: DefaultFence); a quorum of zero or less is off.
func New(quorum int, fence time.Duration) *Mode {
	m := &Mode{quorum: quorum, fence: fence}
	if m.fence <= 0 {
		m.fence = DefaultFence
	}
	return m
}

// Quorum returns the members a ring must hold for this node to decide.
func (m *Mode) Quorum() int { return m.quorum }

// Escrow returns GLOBAL's escrow rules for m: none when strict mode is
// off. Grants are spent for ttl (zero: EscrowTTL(sync)) after the owner
// last renewed them, and an owner keeps a departed node's escrow for the
// fence, which outlasts that and a broadcast's flight; it lends none while
// members, the members of its ring, is below the quorum.
func (m *Mode) Escrow(sync, ttl time.Duration, members func() int) global.EscrowConfig {
	if !m.On() {
		return global.EscrowConfig{}
	}
	if ttl <= 0 {
		ttl = EscrowTTL(sync)
	}
	return global.EscrowConfig{TTL: ttl, Keep: m.fence, MayLend: func() bool { return members() >= m.quorum }}
}
