package global

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
)

// The side of a node that lends grants for counters it owns.

// lease is the owner's side of a GLOBAL counter: what it lent to whom
// (nodes, and lessees: see lessees.go), and, for a parent, the guaranteed
// hits it owes (see parent.go).
type lease struct {
	req     limiter.Request
	nodes   map[string]*nodeLease
	lessees map[Lessee]*lesseeAccount
	rates   float64 // the sum of the lessees' demand, hits a second
	debt    int64
	// shares are the streams' rate shares (shares.go), which may be raised
	// above what their streams claim from raiseFrom on.
	shares    map[Lessee]*shareAccount
	raiseFrom time.Time
	// checkedAt is when this owner last decided a GLOBAL check of the
	// counter itself (see Node.weight).
	checkedAt time.Time
}

// nodeLease is one node's account with the owner: what it was granted,
// what it reported admitted and forced (see Force), in all.
type nodeLease struct {
	granted, received, epoch int64
	forced                   int64
	want                     bool
	goneAt                   time.Time // when it was first seen out of the ring (escrow.go)
}

// outstanding is the hits lent, to nodes and lessees, and not yet
// reported used.
func (l *lease) outstanding() int64 {
	var out int64
	for _, n := range l.nodes {
		out += max(0, n.granted-n.received)
	}
	for _, a := range l.lessees {
		out += a.outstanding()
	}
	return out
}

func (l *lease) wanted() bool {
	for _, n := range l.nodes {
		if n.want {
			return true
		}
	}
	return false
}

// lease returns k's lease, creating it, with r's limit. A new lease starts
// from the grants this node kept as the key's heir, if any (see heir.go),
// its lessees' accounts with a time-to-live from now. sh.mu is held.
func (sh *shard) lease(k key, r *limiter.Request, now time.Time) *lease {
	l := sh.leases[k]
	if l == nil {
		l = &lease{nodes: make(map[string]*nodeLease), lessees: make(map[Lessee]*lesseeAccount)}
		l.startFrom(sh.heirs[k], r.Limit.Capacity(), sh.book.conf.TTL, now)
		for lessee := range l.lessees {
			sh.book.add(lessee)
		}
		sh.dropHeir(k)
		sh.leases[k] = l
	}
	l.req = *r
	l.req.Hits, l.req.Reset = 0, false
	return l
}

// decideOwned decides a GLOBAL check for a counter this node owns, at
// once: from the counter's remaining hits less what is lent out.
//
// A check decided here for a key the ring gives to another node (this
// node is its heir, deciding while the owner cannot be reached: service's
// failover; or a node whose ring lags sent it here) is decided less what
// that owner lent, as its last broadcast to this node said (heir.go), and
// lends nothing: the other nodes take grants only from the owner of their
// ring.
func (n *Node) decideOwned(r *limiter.Request) algorithms.Decision {
	k := key{r.Name, r.Key}
	now := n.now()
	owner, ok := n.cluster.Ring().Owner(r.Key)
	sh := n.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var out int64
	var l *lease
	if ok && owner.Name != n.cluster.LocalMember().Name {
		out = sh.heirs[k].outstanding(r.Limit.Capacity(), now)
	} else {
		l = sh.lease(k, r, now)
		l.checkedAt = now
		out = l.outstanding()
		sh.dirty[k] = struct{}{}
	}
	return n.decideAgainst(l, r, out)
}

// decideAgainst decides r at once, from its counter's remaining hits less
// out, the hits lent out, and, if l is not nil, less what l's counter
// owes. The shard's lock is held.
func (n *Node) decideAgainst(l *lease, r *limiter.Request, out int64) algorithms.Decision {
	if r.Reset {
		reset := *r
		reset.Hits = 0
		n.store.Decide(&reset)
	}
	plain := *r
	plain.Reset = false
	peek := plain
	peek.Hits = 0
	remaining := n.store.Check(&peek).Remaining
	if l != nil {
		remaining = n.payDebt(l, &peek, remaining)
		out += l.debt
	}
	if r.Hits <= remaining-out {
		d := n.store.Decide(&plain)
		d.Remaining = max(0, d.Remaining-out)
		return d
	}
	d := n.store.Check(&plain)
	d.Allowed = false
	d.Remaining = max(0, remaining-out)
	if d.RetryAfter == 0 {
		d.RetryAfter = n.interval // the counter has room, lent out (or owed) until the next round
	}
	return d
}

// owe adds hits to what l's counter owes, at most its capacity (see
// parent.go), and pays what it can at once. sh.mu is held.
func (n *Node) owe(l *lease, r *limiter.Request, hits int64) {
	l.debt = min(l.debt+hits, r.Limit.Capacity())
	peek := *r
	peek.Hits, peek.Reset = 0, false
	n.payDebt(l, &peek, n.store.Check(&peek).Remaining)
}

// payDebt charges l's counter, which has remaining hits left at peek's
// time, with as much of its debt as the room not lent out allows, and
// returns what it has left then. The shard's lock is held.
func (n *Node) payDebt(l *lease, peek *limiter.Request, remaining int64) int64 {
	pay := min(l.debt, max(0, remaining-l.outstanding()))
	if pay <= 0 {
		return remaining
	}
	charge := *peek
	charge.Hits = pay
	n.store.Charge(&charge)
	l.debt -= pay
	return remaining - pay
}

// Receive takes node from's reports of counters this node owns: it
// charges the new hits and notes releases and wants for the next
// broadcast. It refuses the whole request, with an error wrapping
// ErrUnknownSender, from this node's own name or from a node that is not
// in this node's ring and was not within departedGrace. A report that does not validate is rejected
// (logged, sampled, and counted) and the others are taken.
func (n *Node) Receive(from string, reports []*peerpb.GlobalReport) error {
	now := n.now()
	if from == n.cluster.LocalMember().Name || !isMember(n.cluster.Ring(), from) && !n.members.recent(from, now) {
		return fmt.Errorf("from: %q: %w", from, ErrUnknownSender)
	}
	n.receiveAll(from, reports, now)
	return nil
}

// receiveAll takes reports from a node known to be a member.
func (n *Node) receiveAll(from string, reports []*peerpb.GlobalReport, now time.Time) {
	if n.inherit != nil {
		n.inherit()
	}
	members := int64(max(1, n.cluster.Ring().Len()))
	for _, rep := range reports {
		err := checkReport(rep)
		var r limiter.Request
		if err == nil {
			r, err = checks.Request(rep.GetItem(), now, n.skew)
		}
		if err != nil {
			n.reject(kindReport, reasonInvalid, from, err)
			continue
		}
		k := key{r.Name, r.Key}
		sh := n.shard(k)
		sh.mu.Lock()
		excess := n.receive(sh, k, &r, from, rep, members, now)
		sh.mu.Unlock()
		if excess > 0 {
			n.metrics.excessHits.Add(float64(excess))
			n.reject(kindReport, reasonOverGrant, from, fmt.Errorf("%d hits of %s/%s beyond what the node could have admitted, not charged", excess, r.Name, r.Key))
		}
	}
}

// receive applies one report and returns the hits it claims beyond what
// the node could have admitted, which are not charged: more than the rest
// of its grant, or, for a new account, more than what its old account had
// left or one share of what the counter has not lent out (what the owner
// would grant it now), whichever is more. Its new forced hits, the
// guaranteed hits of a parent, are owed whatever the grant (see owe).
// sh.mu is held.
func (n *Node) receive(sh *shard, k key, r *limiter.Request, from string, rep *peerpb.GlobalReport, members int64, now time.Time) (excess int64) {
	l := sh.lease(k, r, now)
	nl := l.nodes[from]
	allowed := int64(0)
	switch {
	case nl == nil || (rep.Epoch > nl.epoch && !rep.Release):
		// A new account (the node forgot the old one, or this owner did):
		// what the node says was charged already is not charged again, and
		// the old account's grant is no longer reserved. Its hits not yet
		// charged were admitted under the old account's grant, with this
		// owner or with the key's owner before it (a node starts a new
		// account when the key changes owner, and this owner may have
		// inherited the old one: see heir.go): they are charged up to what
		// that grant had left, or, if this owner never made or inherited
		// it, up to the share a grant would give now.
		var unused int64
		if nl != nil {
			unused = nl.granted - nl.received
			delete(l.nodes, from)
		}
		peek := *r
		peek.Hits = 0
		avail := max(0, n.store.Check(&peek).Remaining-l.outstanding())
		allowed = max(unused, min(avail, max(1, avail/members)))
		nl = &nodeLease{received: rep.Acked, granted: rep.Acked, forced: rep.ForcedAcked, epoch: rep.Epoch}
		l.nodes[from] = nl
	case rep.Epoch < nl.epoch:
		return 0 // from an account that has been replaced
	}
	if delta := rep.Admitted - nl.received; delta > 0 {
		allowed += max(0, nl.granted-nl.received)
		if charge := min(delta, allowed); charge > 0 {
			r.Hits = charge
			n.store.Charge(r)
		}
		excess = max(0, delta-allowed)
		nl.received = rep.Admitted
	}
	if delta := rep.Forced - nl.forced; delta > 0 {
		n.owe(l, r, delta)
		nl.forced = rep.Forced
	}
	if rep.Release && rep.Epoch > nl.epoch {
		nl.epoch = rep.Epoch
		nl.granted = rep.Admitted
	}
	nl.want = nl.want || rep.Want
	sh.dirty[k] = struct{}{}
	return excess
}

// Broadcast hands the remaining hits of every owned counter that changed
// since the last round out as grants to the nodes that want them, and
// sends every node the new grants and state; the key's heir gets the
// lessees' accounts too. It frees the lessees' grants whose time-to-live
// ran out.
func (n *Node) Broadcast(ctx context.Context) {
	r := n.cluster.Ring()
	members := int64(max(1, r.Len()))
	now := n.now()
	n.members.observe(r, now)
	n.tenure.observe(r, now, n.tenureWindow())
	self := n.cluster.LocalMember().Name
	inRing := map[string]bool{}
	for _, m := range r.Members() {
		inRing[m.Name] = true
	}
	var states []*peerpb.GlobalState
	heirs := map[string][]heirState{} // by heir: the states that carry lessees' accounts
	for i := range n.shards {
		sh := &n.shards[i]
		sh.mu.Lock()
		// Forget the accounts of nodes no longer in the cluster, and of
		// lessees whose time-to-live ran out; leases with nothing lent and
		// nothing asked that saw no check this round; and leases of
		// counters this node no longer owns (their nodes start afresh with
		// the new owner, and their lessees' next reports claim what they
		// hold: see claim).
		for k, l := range sh.leases {
			for name, nl := range l.nodes {
				switch {
				case inRing[name]:
					nl.goneAt = time.Time{}
				case n.departed(nl, now):
					delete(l.nodes, name) // a node that left or died uses no grant (in strict mode, no more)
				}
			}
			if n.expire(sh, l, now) {
				sh.dirty[k] = struct{}{} // the heir learns that the grants are freed
			}
			n.expireShares(sh, l, now)
			_, busy := sh.dirty[k]
			owner, ok := r.Owner(k.key)
			if (ok && owner.Name != self) || (!busy && l.outstanding() == 0 && !l.wanted() && l.debt == 0 && len(l.shares) == 0) {
				sh.dropLease(k)
			}
		}
		sh.forgetStaleHeirLeases(now)
		var owing []key
		for k := range sh.dirty {
			delete(sh.dirty, k)
			l := sh.leases[k]
			if l == nil {
				continue
			}
			st := n.state(k, l, members, now)
			if lessees := l.lesseeGrants(); len(lessees) > 0 {
				if heir, ok := n.heirs.Heir(r, self, k.key); ok {
					heirs[heir.Name] = append(heirs[heir.Name], heirState{len(states), lessees})
				}
			}
			states = append(states, st)
			if l.debt > 0 {
				owing = append(owing, k)
			}
		}
		for _, k := range owing { // pays more, and says so, next round
			sh.dirty[k] = struct{}{}
		}
		sh.mu.Unlock()
	}
	if len(states) == 0 {
		return
	}
	var wg sync.WaitGroup
	for _, m := range r.Members() {
		if m.Name == self {
			continue
		}
		wg.Go(func() {
			for _, part := range chunks(withLessees(states, heirs[m.Name]), maxBroadcastBytes) {
				if err := n.peers.UpdateGlobals(ctx, m.PeerAddr, self, part); err != nil {
					n.metrics.sendErrors.Inc()
					n.log.Warn("GLOBAL state not sent", "member", m.Name, "err", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// heirState is the lessees' accounts of the state at index i of a
// broadcast, for the key's heir only.
type heirState struct {
	i       int
	lessees []*peerpb.LesseeGrant
}

// withLessees returns states, with the lessees' accounts of mine added to
// copies of their states (states is shared by every member's broadcast).
func withLessees(states []*peerpb.GlobalState, mine []heirState) []*peerpb.GlobalState {
	if len(mine) == 0 {
		return states
	}
	out := slices.Clone(states)
	for _, h := range mine {
		st := proto.CloneOf(states[h.i])
		st.Lessees = h.lessees
		out[h.i] = st
	}
	return out
}

// maxBroadcastBytes bounds one UpdateGlobals call: a quarter of the peer
// port's receive limit (peer.MaxMessageBytes), so that a round of many
// changed counters, or of keys with many lessees, goes in several calls
// rather than being refused for its size.
const maxBroadcastBytes = 1 << 20

// chunks splits states into runs of at most maxBytes encoded bytes (a
// state larger than that alone).
func chunks(states []*peerpb.GlobalState, maxBytes int) [][]*peerpb.GlobalState {
	var out [][]*peerpb.GlobalState
	start, size := 0, 0
	for i, st := range states {
		n := proto.Size(st)
		if i > start && size+n > maxBytes {
			out = append(out, states[start:i])
			start, size = i, 0
		}
		size += n
	}
	return append(out, states[start:])
}

// state lends what l's counter has left, once it has paid what it can of
// its debt, and returns the broadcast of its grants and state. The
// shard's lock is held.
func (n *Node) state(k key, l *lease, members int64, now time.Time) *peerpb.GlobalState {
	peek := l.req
	peek.Now = now
	counter := n.store.Check(&peek)
	remaining := n.payDebt(l, &peek, counter.Remaining) - l.debt
	if n.mayLend() {
		l.grant(remaining, members)
	}
	one := peek
	one.Hits = 1
	st := &peerpb.GlobalState{
		Name: k.name, Key: k.key, Limit: l.req.Limit.Count, Members: members,
		Remaining:    max(0, remaining-l.outstanding()),
		ResetTimeMs:  now.Add(counter.ResetAfter).UnixMilli(),
		RetryAfterMs: max(0, n.store.Check(&one).RetryAfter.Milliseconds()),
	}
	for name, nl := range l.nodes {
		st.Grants = append(st.Grants, &peerpb.GlobalGrant{Node: name, Granted: nl.granted, Epoch: nl.epoch, Received: nl.received})
	}
	return st
}

// grant lends what remains of the counter, less what is lent already, to
// the nodes that want it: each gets at most an equal share of members, so
// that one busy node cannot take everything, and at least one hit while
// any remains.
func (l *lease) grant(remaining, members int64) {
	avail := remaining - l.outstanding()
	var wanting []string
	for name, nl := range l.nodes {
		if nl.want {
			wanting = append(wanting, name)
		}
	}
	slices.Sort(wanting)
	part := max(1, avail/members)
	for _, name := range wanting {
		nl := l.nodes[name]
		give := min(part, max(0, avail))
		nl.granted = max(nl.granted, nl.received) + give
		avail -= give
		nl.want = false
	}
}
