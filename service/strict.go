package service

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/global"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// Strict mode: never more than the limit, in any partition or crash.
//
// By default an owner that cannot be reached is replaced: its heir
// decides its keys on a replica, or each node on its share, so every
// check is answered and a key can be over its limit by what was decided
// on both sides. In strict mode (Config.StrictQuorum > 0, on every node)
// a key is decided only where no other node can be deciding it at the
// same time, and a check that cannot be is refused, saying so
// (decided_by "escrow"):
//
//   - Only the owner decides a key, and only while its ring holds at least
//     StrictQuorum members (a majority of the cluster: two sides of a
//     split cannot both hold one). There is no failover to the heir and
//     no fallback to a share: a check whose owner cannot be reached is
//     decided from this node's escrow, its GLOBAL grant (hits the owner
//     reserved for this node in advance, which it spends for at most the
//     escrow's time-to-live after the owner last renewed it), or, with no
//     escrow, refused.
//   - A node that comes to own keys of a member that left its ring (dead,
//     frozen or cut off: no node can tell) decides none of them until
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
//   - An owner lends no escrow while it lacks a quorum, and keeps the
//     escrow of a node that left its ring reserved until it has expired
//     (global.EscrowConfig).
//
// The cost is refusals: on a side without a quorum every key but what its
// escrows hold; on the majority side, a departed member's keys for the
// fence, and then until their counters refill.

// DefaultStrictFence is the default Config.StrictFence: memberlist's
// verdict on a cut-off member (about 5 s, on the same timers on both sides
// of a split), with room for the two sides' verdicts to differ by as much
// again, the escrow time-to-live and a lessee's (2 s by default).
const DefaultStrictFence = 15 * time.Second

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

// escrowRetry is the retry_after of a check refused for want of escrow: a
// suspicion's life, after which the owner is tried again.
const escrowRetry = suspectFor

// maxDrops bounds the departures strict mode remembers; the oldest is
// forgotten first (a cluster losing members this often has no quorum).
const maxDrops = 64

// maxCharged bounds the counters the departures remember having charged,
// together (about 100 bytes each); beyond it, a counter is charged at every
// check until its window ends: more refusals, never more admissions.
const maxCharged = 1 << 18

// strictMode is a Service's strict mode: its settings, and the members
// that left the ring lately. The zero value is off. It is safe for
// concurrent use: checks read the departures without a lock (an immutable
// slice, replaced on each ring change), and lock only to mark a charge.
type strictMode struct {
	quorum int
	fence  time.Duration
	drops  atomic.Pointer[[]*drop] // oldest first
	mu     sync.Mutex              // serializes ringChanged, and guards every drop's charged and charged
	last   *ring.Ring              // the ring of the last ringChanged
	// charged is the size of the drops' charged maps, together.
	charged int
}

// drop is a member that left the ring: the ring that still had it, when
// it left, and the counters charged since on its behalf.
type drop struct {
	name    string
	before  *ring.Ring
	at      time.Time
	charged map[counterID]struct{}
}

// counterID names a counter without its limit.
type counterID struct {
	name, key string
	alg       limiter.Algorithm
	role      limiter.Role
}

// on reports whether strict mode is on.
func (m *strictMode) on() bool { return m.quorum > 0 }

// ringChanged records the members of the last ring that r lacks, but self,
// as departed at now.
func (m *strictMode) ringChanged(r *ring.Ring, self string, now time.Time) {
	if !m.on() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.last != nil {
		var drops []*drop
		if old := m.drops.Load(); old != nil {
			drops = *old
		}
		for _, mem := range m.last.Members() {
			if mem.Name != self && !r.Has(mem.Name) {
				first := max(0, len(drops)-maxDrops+1)
				for _, old := range drops[:first] {
					m.charged -= len(old.charged)
				}
				drops = append(drops[first:len(drops):len(drops)],
					&drop{name: mem.Name, before: m.last, at: now, charged: map[counterID]struct{}{}})
			}
		}
		m.drops.Store(&drops)
	}
	m.last = r
}

// A verdict is what strict mode says of a check this node would decide as
// its key's owner.
type verdict uint8

const (
	verdictDecide verdict = iota // decide it
	verdictCharge                // count its counter as spent first, then decide it
	verdictRefuse                // refuse it: no quorum, or its key's last owner may still be deciding it
)

// judge returns the verdict on r, decided here at now as the owner of its
// key in cur. A verdictCharge is given once per counter and departure.
func (m *strictMode) judge(r *limiter.Request, cur *ring.Ring, now time.Time) verdict {
	if cur.Len() < m.quorum {
		return verdictRefuse
	}
	drops := m.drops.Load()
	if drops == nil {
		return verdictDecide
	}
	var due []*drop // the departures that may still owe r's counter its charge
	for _, d := range *drops {
		if cur.Has(d.name) || now.Sub(d.at) >= m.fence+refillTime(r.Limit) {
			continue // it is back, and owns its keys again; or the counter has refilled since it could last decide
		}
		if owner, _ := d.before.Owner(r.Key); owner.Name != d.name {
			continue
		}
		if now.Sub(d.at) < m.fence {
			return verdictRefuse
		}
		due = append(due, d)
	}
	if len(due) == 0 {
		return verdictDecide
	}
	id := counterID{r.Name, r.Key, r.Algorithm, r.Role}
	v := verdictDecide
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
		v = verdictCharge
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

// gate applies strict mode to the pending checks ps of c that this node
// would decide as their key's owner in view v: those refused are refused
// from escrow, and those whose counter is to be counted spent are charged
// first. LOCAL checks are this node's own, and not gated.
func (m *strictMode) gate(s *Service, c *call, ps []pending, v *view) {
	if !m.on() {
		return
	}
	now := s.now() // the server's clock, not a check's created_at_ms: a client cannot shorten a fence
	for k := range ps {
		p := &ps[k]
		if c.behavior(p.j) == pb.Behavior_LOCAL || !(p.next == nextHere || (p.next == nextOwner && v.owns(p.to))) {
			continue
		}
		r := &c.reqs[p.j]
		switch m.judge(r, v.ring, now) {
		case verdictRefuse:
			p.next = nextEscrow
		case verdictCharge:
			spend := *r
			spend.Hits, spend.Reset = r.Limit.Capacity(), false
			s.store.Charge(&spend)
		}
	}
}

// refuseEscrow refuses c.reqs[j], a check this node may not decide and
// holds no escrow for (strict mode), and marks it decided_by "escrow".
func (s *Service) refuseEscrow(c *call, j int) {
	if c.borrows != nil {
		c.borrows[j] = nil
	}
	s.setResult(c, j, algorithms.Decision{RetryAfter: escrowRetry}, routeEscrow)
	c.results[c.pos[j]].Metadata = map[string]string{MetadataDecidedBy: routeEscrow.String()}
}

// configure sets m from conf, and returns GLOBAL's escrow rules for it: none
// when strict mode is off. An owner keeps a departed node's escrow for the
// fence, which outlasts the escrow's time-to-live and a broadcast's flight.
func (m *strictMode) configure(conf Config, s *Service) global.EscrowConfig {
	m.quorum, m.fence = conf.StrictQuorum, conf.StrictFence
	if !m.on() {
		return global.EscrowConfig{}
	}
	if m.fence <= 0 {
		m.fence = DefaultStrictFence
	}
	ttl := conf.EscrowTTL
	if ttl <= 0 {
		ttl = EscrowTTL(conf.GlobalSync)
	}
	return global.EscrowConfig{TTL: ttl, Keep: m.fence, MayLend: func() bool { return s.cluster.Ring().Len() >= m.quorum }}
}

// fromEscrow returns escrowed with the GLOBAL checks of ps added that
// global answered from this node's grant (v.global) while their owner
// cannot be reached (it is suspect, or this node lacks a quorum), by
// index into c.reqs: their answers are marked decided_by "escrow" (see
// markEscrow).
func (m *strictMode) fromEscrow(s *Service, c *call, ps []pending, v *view, escrowed []int) []int {
	if !m.on() || v.global == nil {
		return escrowed
	}
	cut := v.ring.Len() < m.quorum
	for k, p := range ps {
		if v.global[k].decided && !v.owns(p.to) && p.next == nextOwner && (cut || s.suspects.suspect(p.to.PeerAddr)) {
			escrowed = append(escrowed, p.j)
		}
	}
	return escrowed
}

// markEscrow marks the answers of c.reqs[js] decided_by "escrow".
func markEscrow(c *call, js []int) {
	for _, j := range js {
		if r := c.results[c.pos[j]]; r.GetError() == "" {
			r.Metadata = map[string]string{MetadataDecidedBy: routeEscrow.String()}
		}
	}
}
