package handoff

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/ring"
)

// Waiting for counters on their way.
//
// A node that comes to own keys whose counters a member still in the ring
// holds (the key's owner in the previous ring this node saw; the ring
// without itself for a node that had seen only itself) decides their
// checks only once that member has said it is done (HandOffDone with the
// ring's ID) or Config.Wait has passed, and no check waits past halfway
// to its deadline (waitUntil): merging cannot take back what was admitted
// on an empty counter meanwhile. Past the wait the key is late: its checks
// are pulled to that member, or wait for its word again (AwaitCounter),
// and are decided as a stand-in's only once it cannot say (gone, suspect,
// maxLate overdue). Keys gained from a member gone from the ring are not
// waited for, but are late for as long as this node owns them. See
// docs/design-cluster.md, "Waiting for a counter on its way".

// waits are the keys of one ring this node waits for, by partition. A
// newer ring's waits replace them, and release them.
type waits struct {
	ring *ring.Ring
	id   uint64
	// joined says this node had joined the cluster (Membership.Ready)
	// when it worked these waits out (see awaitJoin).
	joined bool
	parts  []*source          // by partition: the member it waits for, or nil; nil when it waits for none
	byName map[string]*source // the members it waits for
	open   atomic.Int32       // sources not released yet
	late   atomic.Int32       // sources whose wait expired, not done since
	// orphans are the partitions this node owns in ring and gained, in
	// this ring or one before, from a member that then went from the
	// ring, by partition, with that member's name: their keys' counters
	// are late for as long as this node owns them and the member has not
	// come back (see the comment on waits). nil when there is none.
	orphans map[int]string
}

// source is a member this node waits for. Its channel done is closed
// once: when the member says it is done, when the wait expires, or when a
// newer ring replaces the waits. After the wait has expired, its channel
// settled is closed when the member says it is done after all, or when a
// newer ring replaces the waits (see awaitArrival).
type source struct {
	name       string
	done       chan struct{}
	once       sync.Once
	expired    atomic.Bool
	expiredAt  atomic.Int64 // Unix ns at which the wait expired, or 0
	arrived    atomic.Bool  // done after the wait expired
	settled    chan struct{}
	settleOnce sync.Once
}

func newSource(name string) *source {
	return &source{name: name, done: make(chan struct{}), settled: make(chan struct{})}
}

// settle closes s's channel settled, once.
func (s *source) settle() { s.settleOnce.Do(func() { close(s.settled) }) }

// release closes s's channel, once, and counts it in w, s's waits;
// expired says the wait ran out rather than ended.
func (s *source) release(w *waits, expired bool) {
	s.once.Do(func() {
		s.expired.Store(expired)
		if expired {
			s.expiredAt.Store(time.Now().UnixNano())
			w.late.Add(1)
		}
		close(s.done)
		w.open.Add(-1)
	})
}

// isLate reports whether s's wait expired and s has not said it is done
// since.
func (s *source) isLate() bool { return s.expired.Load() && !s.arrived.Load() }

func (s *source) released() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// maxDoneSenders bounds the memory of members' "done" messages received
// ahead of this node's ring: far more members than a cluster has.
const maxDoneSenders = 4096

// Await returns once key's counter is here, as far as this node can tell:
// at once unless, in ring r, this node owns key and waits for the member
// that held it (see the comment on waits), then when that member is done,
// the wait has expired, or ctx ends. r is the ring the caller routed key
// by; a ring older than the cluster's current one waits as the current one
// does. It reports whether key's counter is late: the wait for it expired
// and its member has not said it is done since. One check waits at most
// until waitUntil says, however many rings it waits through.
//
// A wait that reaches halfway to the check's deadline (see waitUntil)
// reports the counter late here: Await's callers (a lease's reports, a
// reservation's settlement) take it as they take an expired wait.
func (n *Node) Await(ctx context.Context, r *ring.Ring, key string) (late bool) {
	var began time.Time
	late, err := n.await(ctx, r, key, &began)
	return late || err != nil
}

// ErrNoTime is AwaitCounter's answer for a check whose wait for its
// counter reached halfway to its deadline (see waitUntil) while the
// counter's previous owner had not said it was done: the check is not
// decided, and nothing is charged for it.
var ErrNoTime = errors.New("its wait for the key's counter, still on its way from the key's previous owner, reached halfway to its deadline: not decided")

// AwaitCounter is Await for a check to be decided on key's counter: a
// check is never decided on a counter known to be on its way. For a
// counter Await reports late, it waits for the member it is late from to
// say it is done after all (awaitArrival), until halfway to the check's
// deadline (Config.Wait from when it began to wait, without one), and
// answers ErrNoTime if the word has not come by then: the check is not
// decided, and nothing is charged for it. began is when the check began to
// wait, if it waited already (AwaitJoin), else zero. It reports the
// counter late, to be decided as a stand-in's, when nothing is on its way
// that this node could wait for: the key was gained from a member gone
// from the ring, or keepWaiting says the member would not answer (the
// service suspects it), or that member's word is maxLate overdue (its
// hand-off cannot finish: it holds counters this node refused). Its
// first wait, too, answers ErrNoTime when it reaches halfway to the
// check's deadline.
func (n *Node) AwaitCounter(ctx context.Context, r *ring.Ring, key string, began time.Time, keepWaiting func(from ring.Member) bool) (late bool, err error) {
	late, err = n.await(ctx, r, key, &began)
	if !late || err != nil {
		return false, err
	}
	from, ok := n.Pending(r, key)
	if !ok || !keepWaiting(from) || n.overdue(r, key) {
		return true, nil
	}
	if n.awaitArrival(ctx, r, key, began) {
		return false, ErrNoTime
	}
	return false, nil
}

// maxLate is how long after its wait expired a member that has not said
// its hand-off is done is still waited for: a check whose counter it
// holds is refused meanwhile (see AwaitCounter), and decided as a
// stand-in's after. A member says it is done after each round of hand-off
// that delivered all it holds for this node, retried until it does (a
// slow round on a busy node takes seconds); one that cannot (this node
// refuses some of its counters as invalid, say) would otherwise have
// this node refuse the keys it gained from it until the next ring change.
const maxLate = 10 * time.Second

// overdue reports whether the member that held key's counter, in ring r,
// has not said its hand-off is done maxLate after its wait expired.
func (n *Node) overdue(r *ring.Ring, key string) bool {
	w := n.waits.Load()
	if w.ring != r || w.parts == nil {
		return false
	}
	s := w.parts[ring.Partition(key)]
	if s == nil {
		return false
	}
	at := s.expiredAt.Load()
	return at != 0 && time.Since(time.Unix(0, at)) > maxLate
}

// waitUntil is when a check that began to wait for its counter at began
// stops waiting: Config.Wait after, or halfway from began to ctx's
// deadline if that comes first. The other half is for deciding the check
// and for the answer's way back: a forwarded check carries its sender's
// deadline, and a sender that gives up on an owner that is only slow (a
// node that has just joined, on a busy machine, works out its waits, pulls
// and takes its counters all at once) suspects it and has the check
// decided again by the key's heir, which holds no counter for a key that
// is changing hands. byDeadline says the deadline set the bound: a check
// whose first wait ends so is answered ErrNoTime (await), not decided on
// a counter without what is on its way; a wait for the word again
// (awaitArrival) ends at the same bound, and is answered ErrNoTime too.
func (n *Node) waitUntil(ctx context.Context, began time.Time) (until time.Time, byDeadline bool) {
	until = began.Add(n.wait)
	if deadline, ok := ctx.Deadline(); ok {
		if half := began.Add(deadline.Sub(began) / 2); half.Before(until) {
			return half, true
		}
	}
	return until, false
}

// await is Await, but for a check whose own bound (waitUntil) ends its
// wait by its deadline, for which it returns ErrNoTime. It sets *began to
// when the check began to wait, if it was zero and there may be something
// to wait for.
func (n *Node) await(ctx context.Context, r *ring.Ring, key string, began *time.Time) (late bool, err error) {
	if n.wait <= 0 {
		return false, nil
	}
	p := -1
	var expire *time.Timer // the check's own bound (waitUntil), set on its first wait
	var byDeadline bool
	defer func() {
		if expire != nil {
			expire.Stop()
		}
	}()
	expiry := func() <-chan time.Time {
		if expire == nil {
			var until time.Time
			until, byDeadline = n.waitUntil(ctx, *began)
			expire = time.NewTimer(time.Until(until))
		}
		return expire.C
	}
	expired := func() (bool, error) {
		n.metrics.waits.WithLabelValues("expired").Inc()
		if byDeadline {
			return false, ErrNoTime
		}
		return true, nil
	}
	for {
		w := n.waits.Load()
		if w.ring != r {
			w = n.waitsFor(r)
		}
		if began.IsZero() && (!w.joined || w.open.Load() != 0 || w.late.Load() != 0 || w.orphans != nil) {
			*began = time.Now() // time is read only when there may be something to wait for
		}
		if !w.joined && n.onlySelf(w.ring) { // see awaitJoin
			switch n.awaitJoin(ctx, w.ring, expiry) {
			case joinedRing:
				if r = n.cluster.Ring(); r == w.ring {
					return false, nil // it has joined only itself: alone in truth
				}
				continue
			case joinExpired:
				return expired()
			default:
				n.metrics.waits.WithLabelValues("canceled").Inc()
				return false, nil
			}
		}
		if w.open.Load() == 0 && w.late.Load() == 0 && w.orphans == nil {
			return false, nil
		}
		if p < 0 {
			p = ring.Partition(key)
		}
		if _, orphan := w.orphans[p]; orphan {
			return true, nil
		}
		if w.parts == nil || w.parts[p] == nil {
			return false, nil
		}
		s := w.parts[p]
		if s.released() {
			return s.isLate(), nil
		}
		select { // watches ctx: a stream's next requests need not wait for this one (mux.Serve)
		case <-s.done:
		case <-expiry():
			return expired() // this check's own wait has ended
		case <-ctx.Done():
			n.metrics.waits.WithLabelValues("canceled").Inc()
			return false, nil // the check is not decided: its client has gone
		}
		if next := n.waits.Load(); next != w {
			r = next.ring // a newer ring released the wait: wait as it says
			continue
		}
		if s.expired.Load() {
			n.metrics.waits.WithLabelValues("expired").Inc()
		} else {
			n.metrics.waits.WithLabelValues("done").Inc()
		}
		return s.isLate(), nil
	}
}

// AwaitJoin returns once this node has joined the cluster, for a check
// that comes before it has (see awaitJoin), and at once otherwise, so that
// the caller routes the check by the ring it joins: there, a check whose
// counter another member holds is pulled from it (see package service's
// plan), where one routed by the ring of this node alone would wait for
// that member's word without a pull, and be decided on no counter should
// the word be slow. It waits at most until waitUntil says from now, or
// until ctx ends, and returns when it began to wait (zero if it did not),
// for AwaitCounter: the check's waits share one bound.
func (n *Node) AwaitJoin(ctx context.Context) (began time.Time) {
	if n.wait <= 0 {
		return time.Time{}
	}
	r := n.cluster.Ring()
	if !n.onlySelf(r) {
		return time.Time{}
	}
	w := n.waits.Load()
	if w.ring != r {
		w = n.waitsFor(r)
	}
	if w.joined {
		return time.Time{}
	}
	began = time.Now()
	var expire *time.Timer
	n.awaitJoin(ctx, r, func() <-chan time.Time {
		until, _ := n.waitUntil(ctx, began)
		expire = time.NewTimer(time.Until(until))
		return expire.C
	})
	if expire != nil {
		expire.Stop()
	}
	return began
}

// onlySelf reports whether r holds this node alone: the ring of a node
// that may not have joined its cluster yet (see awaitJoin). A node that
// has left gossip is not Ready either, but routes by the ring of the
// members it left, without itself: one of two that leaves routes by a
// ring of the other alone, and has nothing to join. Holding the checks
// the other still forwards to it, to be refused at halfway to their
// deadline, failed them as it left.
func (n *Node) onlySelf(r *ring.Ring) bool {
	return r.Len() == 1 && r.Has(n.cluster.LocalMember().Name)
}

// How awaitJoin ended.
const (
	joinedRing  = iota // the cluster's ring has changed
	joinExpired        // Config.Wait passed first
	joinGaveUp         // the caller gave up
)

// joinPoll is how often awaitJoin looks at the cluster's ring.
const joinPoll = 10 * time.Millisecond

// awaitJoin waits, for a check decided here while this node has not
// joined the cluster and its ring holds only itself, until the cluster's
// ring is another than alone (gossip has told it of the others), expire
// fires (the check's wait has expired: see waitUntil), or ctx ends. Such
// a node owns every key, but the others hold their counters; they see it
// join, and forward checks to it, a moment before it has their ring. A
// check decided on that ring would start from an empty counter; decided
// on the ring it joins, it waits for the counter's true holder as any
// other (see the comment on waits).
// The ring is polled: a node learns of its first members at start-up
// only, before it answers anyone, so the polling lasts that moment.
// expiry makes the check's timer, and is called only when there is
// something to wait for: a node alone in its cluster, the cluster joined,
// passes here on every check, and makes no timer.
func (n *Node) awaitJoin(ctx context.Context, alone *ring.Ring, expiry func() <-chan time.Time) int {
	if n.cluster.Ring() != alone || n.cluster.Ready() {
		return joinedRing
	}
	expire := expiry()
	poll := time.NewTicker(joinPoll)
	defer poll.Stop()
	for n.cluster.Ring() == alone && !n.cluster.Ready() {
		select {
		case <-poll.C:
		case <-expire:
			return joinExpired
		case <-ctx.Done():
			return joinGaveUp
		}
	}
	return joinedRing
}

// Pending returns the member this node waits for, in ring r, to hand over
// key's counter (see Await), without waiting: the key's previous owner,
// which holds the counter until its hand-off, if this node owns key in r
// and that member has not said it is done, whether or not the wait for
// it has expired. A wait expires when the member is slow to see the
// ring change (gossip lags on a busy node): it holds the counter still,
// and decides the checks pulled to it (see package service's plan) on
// it, where this node would decide them on a counter without its hits.
func (n *Node) Pending(r *ring.Ring, key string) (ring.Member, bool) {
	if n.wait <= 0 {
		return ring.Member{}, false
	}
	w := n.waits.Load()
	if w.ring != r {
		w = n.waitsFor(r)
	}
	if w.open.Load() == 0 && w.late.Load() == 0 || w.parts == nil {
		return ring.Member{}, false
	}
	s := w.parts[ring.Partition(key)]
	if s == nil || s.released() && !s.isLate() {
		return ring.Member{}, false
	}
	return w.ring.Member(s.name)
}

// awaitArrival waits, for a key whose counter Await has just reported
// late, until the member it is late from says it is done after all (the
// counter, sent before the word, is then here), or ctx ends, or the wait
// reaches its bound: halfway from began, when the check began to wait for
// the counter, to ctx's deadline, or without one Config.Wait after began.
// It reports whether the counter is late still. A check decided then, on
// the part of the counter that has arrived (or on a counter begun here,
// or loaded from a snapshot), could admit what the part on its way has
// already spent. A key gained from a member gone from the ring is late at
// once: nothing is on its way from a member that crashed, and one beyond a
// partition sends nothing until the heal.
func (n *Node) awaitArrival(ctx context.Context, r *ring.Ring, key string, began time.Time) (late bool) {
	if n.wait <= 0 {
		return false
	}
	until := began.Add(n.wait)
	if deadline, ok := ctx.Deadline(); ok {
		until = began.Add(deadline.Sub(began) / 2)
	}
	d := time.Until(until)
	var expire <-chan time.Time // nil: no time left to wait
	if d > 0 {
		timer := time.NewTimer(d)
		defer timer.Stop()
		expire = timer.C
	}
	p := ring.Partition(key)
	for {
		w := n.waits.Load()
		if w.ring != r {
			w = n.waitsFor(r)
		}
		if _, orphan := w.orphans[p]; orphan {
			return true
		}
		if w.parts == nil || w.parts[p] == nil {
			return false
		}
		s := w.parts[p]
		on := s.settled // late: the member's word after all
		if !s.released() {
			on = s.done // a newer ring waits for it afresh
		} else if !s.isLate() {
			return false
		}
		if expire == nil {
			return true
		}
		select {
		case <-on:
		case <-expire:
			n.metrics.waits.WithLabelValues("still_late").Inc()
			return true
		case <-ctx.Done():
			n.metrics.waits.WithLabelValues("canceled").Inc()
			return true
		}
		if s.arrived.Load() {
			n.metrics.waits.WithLabelValues("arrived_late").Inc()
		}
		r = n.waits.Load().ring // look again: the word came, or a newer ring
	}
}

// HandOffDone takes member from's word that it has handed this node every
// counter it held for keys this node owns in the ring whose ID is id:
// checks waiting for those go ahead. A word for a ring this node has not
// seen yet is kept until it does.
func (n *Node) HandOffDone(from string, id uint64) {
	n.waitMu.Lock()
	defer n.waitMu.Unlock()
	if len(n.done) >= maxDoneSenders {
		clear(n.done) // only forged senders get here; a real sender says it again after its next round
	}
	n.done[from] = id
	if w := n.waits.Load(); w != nil && w.id == id {
		if s := w.byName[from]; s != nil {
			s.release(w, false)
			if s.expired.Load() && s.arrived.CompareAndSwap(false, true) {
				w.late.Add(-1)
				s.settle()
			}
		}
	}
}

// hadRings are the IDs of the last rings a node has left. A member's
// word said of a ring this node has not had yet is kept through the rings
// between until this node gets there (the member says it once, after its
// round under that ring, and members see a change in turn: under mutual
// TLS each admits the others one check at a time); one said of a ring it
// has left is dropped at the next change. A ring left longer ago than
// the last len(hadRings) counts as not had yet: its word is kept until
// the member says another, which it does after every ring change of its
// own.
type hadRings struct {
	ids  [16]uint64
	next int
}

func (h *hadRings) add(id uint64) {
	h.ids[h.next] = id
	h.next = (h.next + 1) % len(h.ids)
}

func (h *hadRings) has(id uint64) bool { return slices.Contains(h.ids[:], id) }

// waitsFor returns the waits of ring r, working them out if r is the
// cluster's current ring and they are not known yet.
func (n *Node) waitsFor(r *ring.Ring) *waits {
	n.waitMu.Lock()
	defer n.waitMu.Unlock()
	old := n.waits.Load()
	if old.ring == r {
		return old
	}
	if r != n.cluster.Ring() {
		return old // r is older than the waits this node has
	}
	w := n.newWaits(old, r)
	n.waits.Store(w)
	for _, s := range old.byName {
		s.release(old, false) // after the Store: its waiters look again, at w
		s.settle()
	}
	return w
}

// returning reports whether this node is a process back under its name
// (Membership.Returning) that waits for its keys' heirs under ring r:
// under every ring until the first that has every member its join found,
// that one included. Called with waitMu held.
func (n *Node) returning(r *ring.Ring) bool {
	found := n.cluster.Returning()
	if found == nil || n.back {
		return false
	}
	n.back = !slices.ContainsFunc(found, func(name string) bool { return !r.Has(name) })
	return true
}

// newWaits works out the waits of ring r, which follows old's ring. A key
// r gains from
// a member old was still waiting for, and that r still has, is waited for
// again.
func (n *Node) newWaits(old *waits, r *ring.Ring) *waits {
	self := n.cluster.LocalMember().Name
	id := r.ID()
	n.had.add(old.id)
	for name, got := range n.done {
		if got != id && n.had.has(got) {
			delete(n.done, name) // said of a ring this node has left: should it return to that one, it must be said again
		}
	}
	w := &waits{ring: r, id: id, byName: map[string]*source{}, joined: n.cluster.Ready()}
	prev := old.ring
	if prev.Len() == 0 || n.onlySelf(prev) {
		prev = n.heirs.Without(r, self)
	}
	// A node that had not joined under old's ring (a new process) may have
	// built it before gossip brought every member: a member r adds may
	// hold the counters, or a returning owner's replicas, of keys this
	// node kept from old's ring. It is waited for as their heir. So is
	// every heir of a process back under its name, until its ring has
	// every member its join found (returning): however late it built its
	// rings, its keys' heirs hold their replicas, or their counters.
	returning := n.returning(r)
	var heirs *ring.Ring
	if returning || !old.joined && prev == old.ring {
		heirs = n.heirs.Without(r, self)
	}
	for p := range ring.PartitionCount {
		if owner, _ := r.PartitionOwner(p); owner.Name != self {
			continue
		}
		from := ""
		held, ok := prev.PartitionOwner(p)
		gone := ""
		switch {
		case !ok:
		case held.Name != self && !r.Has(held.Name):
			gone = held.Name // gained from a member gone from the ring
		case held.Name == self && !r.Has(old.orphans[p]):
			gone = old.orphans[p] // gained so before, and the member is still gone
		}
		if gone != "" {
			if w.orphans == nil {
				w.orphans = make(map[int]string)
			}
			w.orphans[p] = gone
		}
		heir := ""
		if heirs != nil {
			if h, ok := heirs.PartitionOwner(p); ok && (returning || !old.ring.Has(h.Name)) {
				heir = h.Name // a member the ring before lacked (see heirs)
			}
		}
		switch {
		case ok && held.Name != self && r.Has(held.Name):
			from = held.Name
		case heir != "":
			// Ahead of a member still waited for under the ring
			// before: that one was the heir of a ring that lacked this
			// heir, and holds none of the replicas this one does.
			from = heir
		case old.parts != nil && old.parts[p] != nil && !old.parts[p].released() && r.Has(old.parts[p].name):
			from = old.parts[p].name // still on its way under the ring before
		}
		if from == "" || n.done[from] == id {
			continue
		}
		s := w.byName[from]
		if s == nil {
			s = newSource(from)
			w.byName[from] = s
		}
		if w.parts == nil {
			w.parts = make([]*source, ring.PartitionCount)
		}
		w.parts[p] = s
	}
	w.open.Store(int32(len(w.byName)))
	if len(w.byName) > 0 {
		n.log.Info("waiting for counters from the keys' previous owners", "members", len(w.byName), "for_at_most", n.wait)
		time.AfterFunc(n.wait, func() {
			for _, s := range w.byName {
				if !s.released() {
					n.log.Warn("hand-off wait expired: deciding keys without the counters their previous owner may hold",
						"owner", s.name)
				}
				s.release(w, true)
			}
		})
	}
	return w
}
