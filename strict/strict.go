// Package strict is strict mode: never more than the limit, in any
// partition or crash.
//
// By default an owner that cannot be reached is replaced: its heir
// decides its keys on a replica, or each node on its share, so every
// check is answered and a key can be over its limit by what was decided
// on both sides. In strict mode (a quorum set on every node,
// service.Config.StrictQuorum) a key is decided only where no other node
// can be deciding it at the same time, and a check that cannot be is
// refused, saying so (decided_by "escrow"):
//
//   - Only the owner decides a key, and only while its ring holds at least
//     quorum members (a majority of the cluster: two sides of a
//     split cannot both hold one). There is no failover to the heir and
//     no fallback to a share: a check whose owner cannot be reached is
//     decided from this node's escrow, its GLOBAL grant (hits the owner
//     reserved for this node in advance, which it spends for at most the
//     escrow's time-to-live after the owner last renewed it), or, with no
//     escrow, refused.
//   - A node that comes to own keys of a member that left its ring (dead,
//     frozen or cut off: no node can tell), but one that said it left
//     (below), decides none of them until
//     StrictFence has passed since the member left: by then the member,
//     if it lives, has lost its quorum and stopped deciding, and the
//     escrows it lent have expired (the fence exceeds the time memberlist
//     takes to declare the majority dead on the far side, the escrow
//     time-to-live and a lessee's). Then it counts each such key's counter
//     as spent, once, at the first check after the fence: what the member
//     admitted and had not replicated is unknown, and a spent counter
//     admits nothing that, added to any of it, exceeds the limit in any
//     window. Keys first checked once their limit would have refilled
//     anyway (a period, or a bucket's refill, after the fence) are not
//     charged.
//   - A member that comes back owns its keys again (its counters are
//     exact: no one else decided them), but the counter of one of them
//     that its heir holds until the hand-off may be a stale copy (a
//     promoted replica): the heir refuses the checks that reach it there
//     meanwhile rather than decide them on it (see Mode.Judge).
//   - An owner lends no escrow while it lacks a quorum, and keeps the
//     escrow of a node that left its ring reserved until it has expired
//     (global.EscrowConfig).
//   - A member that leaves gracefully (SIGTERM: see package node's leave)
//     and says so is not fenced: its keys' new owners decide them at once
//     (see "A graceful leave" below).
//
// The cost is refusals: on a side without a quorum every key but what its
// escrows hold; on the majority side, the keys of a departed member that
// did not say it left, for the fence, and then until their counters
// refill.
//
// # A graceful leave, and what it proves
//
// The fence is there because a member that drops out of the ring may be
// alive and deciding. A member that shuts down gracefully is not: it
// routes every check by the ring without itself (service.Service.Leave), hands
// each counter to its new owner, leaves gossip, hands on what reached it
// meanwhile, closes its client ports and then its peer port, and only
// then, holding no counter of a member's keys, sends that member its last
// word (service.Service.SayLeft, HandOffRequest.left): from then on it cannot
// decide a check or take a counter, so everything it ever admitted for
// the keys the member gained is in the counters the member now holds. A
// node takes the word (Mode.TakeLeft) only for the latest departure
// of that member it has seen, only while its ring still lacks it, and
// only if the ring the sender left is the ring this node's dropped it
// into; then the departure's keys are decided at once, uncharged.
// Otherwise the fence stands:
//
//   - Memberlist's own leave message (a dead message from the node about
//     itself, StateLeft) is not taken as proof: it is gossip, relayed by
//     any member and, without --gossip-key, by anyone who can send a UDP
//     packet; a captured one, even encrypted, can be replayed; and it says
//     nothing of the hand-off, which it precedes. The last word is a peer
//     call from the member itself, under its own name (mutual TLS, see
//     peer.Guard), which the member makes only once it is done.
//   - A member cut off by a partition cannot send it across: its keys stay
//     fenced.
//   - A member whose hand-off did not finish (a timeout, an owner that
//     refused counters, a crash mid-hand-off) does not send it to the
//     owners of the counters it still holds: their keys stay fenced. Nor
//     does one whose ring changed while it left (the counters may have
//     gone to a member that has them still).
//   - A word is bound to one departure: it names the ring the member
//     left, and is taken only for this node's latest departure of that
//     member, while the ring lacks it and within the fence. A member that
//     comes back and then fails is a new departure, which only a new word
//     could mark; a member sends one only at the end of a graceful
//     shutdown, and mutual TLS does not let a recorded call be replayed.
//     Without mutual TLS on the peer port anyone who reaches it can send
//     a word under any name, as it can send any peer call.
//   - GLOBAL checks of its keys stay fenced: the grants an owner lends are
//     not charged in the counter it hands over but held in its lease
//     (global/leases.go), and reach the new owner only through the grants
//     of the last broadcast it kept as the key's heir (global/heir.go);
//     and a leaving node's GLOBAL side owns the key by its gossip ring
//     until it leaves gossip, so it decides the checks forwarded to it,
//     and lends, after its hand-off, on a counter it no longer holds. So a
//     GLOBAL key's counter does not hold everything the member let others
//     admit (nor, for that last reason, is a GLOBAL key exact through a
//     graceful leave even with the fence: docs/cluster.md, "Not covered
//     yet").
//   - So do checks with a ceiling (package borrow): a leaving node decides
//     those after it lets hand-off rounds go on (they may wait on the
//     parent's owner: see decideHere), so one may land on a counter the
//     node has just handed over, and what it charges there, handed over
//     later, is merged by the more charged state, not added. (A check
//     without a ceiling of a counter that other checks borrow through is
//     decided at once: clients that mix the two on one counter are exact
//     through a graceful leave only while no check with a ceiling is in
//     flight at the leaving node as it hands that counter over.)
//   - The escrow the member held of others' GLOBAL keys stays reserved at
//     their owners until the fence has passed (global.EscrowConfig.Keep),
//     as for any departure: at most its share of each key's limit.
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
// gives to another member (see custody's settle); holds reports whether this node
// holds a check's counter (nil: never); keepFence says r is a check that a
// departure that said it left still fences: a GLOBAL one, or one with a
// ceiling (see "A graceful leave"). A Charge is given once per
// counter and departure.
//
// A member that comes back owns its keys again, and its departure no
// longer fences them; but a counter of one of them held here, by the
// member's heir, may be a copy (a promoted replica) that lacks what the
// member admitted since, while it was cut off from this node. Such a
// counter is not decided on until it has gone to the member (hand-off),
// within the fence and the counter's refill after the departure: checks
// of the key that reach this node meanwhile (from a node whose ring still
// lacks the member) are refused. A member that said it left handed its
// counters here, and they are its key's own.
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
