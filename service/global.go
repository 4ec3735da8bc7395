package service

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// GLOBAL behaviour: answers at once from local state, never more than the
// limit in total.
//
// The owner holds the counter. It lends each other node a grant: hits the
// node may admit on its own. Grants are reserved: the owner admits its own
// checks, and grants more, only from the counter's remaining hits minus
// every grant not yet used up. Every --global-sync each node reports to the
// owner the total hits it admitted (a running total, so a retried report
// never counts twice) and whether it wants more; the owner charges the new
// hits, hands the remaining hits out as grants to the nodes that asked
// (each gets at most remaining/members a round, so none can starve the
// others), and broadcasts the grants and the counter's state. A node that
// went a whole round without a check gives back the rest of its grant, so
// that idle nodes hold nothing. A node that has no grant yet for a key
// forwards the check to the owner, which decides it at once, exactly.
//
// So the cluster never admits more than the limit. What it costs: a check
// at a node whose grant is spent goes to the owner (as BATCHED does) until
// the next round brings a grant, unless the owner last reported nothing
// left, in which case it is refused locally at once; and hits lent to a
// node are not refilled until the node reports them used or gives them
// back.

// globalKey identifies a counter without building a string.
type globalKey struct{ name, key string }

// globalEntry is this node's side of a GLOBAL counter it does not own.
type globalEntry struct {
	req        limiter.Request // the latest check's limit and algorithm
	owner      string          // the owner the totals below are kept with
	admitted   int64           // hits admitted here, in all
	granted    int64           // hits the owner allows here, in all
	sent       int64           // admitted hits the owner has acknowledged
	epoch      int64           // the account: new per entry, +1 per release, so that stale grants are ignored
	known      bool            // a grant for this epoch arrived
	want       bool            // a check was refused: ask for a grant
	active     bool            // a check came since the last report
	release    bool            // a release to report
	remaining  int64           // the owner's last report of the counter
	resetAt    time.Time       // when the counter is full again
	retryAfter time.Duration   // owner's estimate of the wait for one hit
}

// lease is the owner's side of a GLOBAL counter: what it lent to whom.
type lease struct {
	req   limiter.Request
	nodes map[string]*nodeLease
}

// nodeLease is one node's account with the owner.
type nodeLease struct {
	granted, received, epoch int64
	want                     bool
}

// outstanding is the hits lent and not yet reported used.
func (l *lease) outstanding() int64 {
	var out int64
	for _, n := range l.nodes {
		out += max(0, n.granted-n.received)
	}
	return out
}

// globals holds this node's GLOBAL state: entries for counters others own,
// leases for counters it owns.
type globals struct {
	s        *Service
	interval time.Duration

	mu        sync.Mutex
	entries   map[globalKey]*globalEntry
	leases    map[globalKey]*lease
	dirty     map[globalKey]struct{} // leases to broadcast
	lastEpoch int64                  // the newest entry's first epoch
}

// epochGap leaves room for this many releases in one entry's epochs
// before the next entry's.
const epochGap = 1 << 20

// newEpoch returns the first epoch of a new entry: larger than any epoch
// this process used before, and than those of earlier processes (it starts
// from the wall clock), so that an owner can tell a new account from an
// old one. g.mu is held.
func (g *globals) newEpoch() int64 {
	g.lastEpoch = max(g.lastEpoch+epochGap, time.Now().UnixNano())
	return g.lastEpoch
}

// maxGlobalEntries bounds the GLOBAL counters a node tracks for others,
// whatever clients send.
const maxGlobalEntries = 100_000

func newGlobals(s *Service, interval time.Duration) *globals {
	return &globals{
		s: s, interval: interval,
		entries: make(map[globalKey]*globalEntry),
		leases:  make(map[globalKey]*lease),
		dirty:   make(map[globalKey]struct{}),
	}
}

// decide answers a GLOBAL check for a counter owned by owner, another
// node, from this node's grant. It returns forward when the owner must
// decide: this node has no grant yet, or the check resets the counter.
func (g *globals) decide(r *limiter.Request, owner string) (d algorithms.Decision, forward bool) {
	k := globalKey{r.Name, r.Key}
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.entries[k]
	if e == nil {
		if len(g.entries) >= maxGlobalEntries {
			g.evictOne()
		}
		e = &globalEntry{owner: owner, epoch: g.newEpoch()}
		g.entries[k] = e
	}
	e.req = *r
	e.active = true
	if e.owner != owner {
		e.reown(owner, g.newEpoch())
	}
	if !e.known || r.Reset {
		e.want = true
		return d, true
	}
	d.ResetAfter = max(0, e.resetAt.Sub(r.Now))
	d.Remaining = max(0, e.remaining-(e.admitted-e.sent))
	switch {
	case r.Hits > r.Limit.Capacity():
		d.RetryAfter = algorithms.Never
	case e.admitted+r.Hits <= e.granted:
		d.Allowed = true
		e.admitted += r.Hits
		d.Remaining = max(0, d.Remaining-r.Hits)
	case e.remaining > 0:
		// The grant is spent but the owner has hits it has not lent:
		// it decides, and the next round brings a grant.
		e.want = true
		return d, true
	default:
		d.RetryAfter = max(e.retryAfter, g.interval)
		e.want = true
	}
	return d, false
}

// reown starts a new account for e with a new owner: hits not yet
// reported go to the new owner as this node's first report.
func (e *globalEntry) reown(owner string, epoch int64) {
	unsent := e.admitted - e.sent
	*e = globalEntry{req: e.req, owner: owner, epoch: epoch, admitted: unsent, granted: unsent, want: true, active: true}
}

// evictOne forgets an entry with nothing to report or hold (the map's
// order makes it a random one), or, if every entry has, any entry: its
// unreported hits are lost, and the owner keeps its grant reserved until
// this node's next account for the key replaces it. g.mu is held.
func (g *globals) evictOne() {
	for k, e := range g.entries {
		if e.admitted == e.sent && e.granted == e.admitted {
			delete(g.entries, k)
			return
		}
	}
	for k := range g.entries {
		delete(g.entries, k)
		return
	}
}

// decideOwned decides a GLOBAL check for a counter this node owns, at
// once: from the counter's remaining hits less what is lent out.
func (g *globals) decideOwned(r *limiter.Request) algorithms.Decision {
	k := globalKey{r.Name, r.Key}
	g.mu.Lock()
	defer g.mu.Unlock()
	l := g.lease(k, r)
	if r.Reset {
		reset := *r
		reset.Hits = 0
		g.s.store.Decide(&reset)
	}
	plain := *r
	plain.Reset = false
	peek := plain
	peek.Hits = 0
	remaining := g.s.store.Check(&peek).Remaining
	out := l.outstanding()
	g.dirty[k] = struct{}{}
	if r.Hits <= remaining-out {
		d := g.s.store.Decide(&plain)
		d.Remaining = max(0, d.Remaining-out)
		return d
	}
	d := g.s.store.Check(&plain)
	d.Allowed = false
	d.Remaining = max(0, remaining-out)
	if d.RetryAfter == 0 {
		d.RetryAfter = g.interval // the counter has room, lent out until the next round
	}
	return d
}

// lease returns k's lease, creating it. g.mu is held.
func (g *globals) lease(k globalKey, r *limiter.Request) *lease {
	l := g.leases[k]
	if l == nil {
		l = &lease{nodes: make(map[string]*nodeLease)}
		g.leases[k] = l
	}
	l.req = *r
	l.req.Hits, l.req.Reset = 0, false
	return l
}

// decideGlobal decides c.reqs[js], which are GLOBAL, and returns those
// that must go to their owner (see globals.decide).
func (s *Service) decideGlobal(c *call, js []int) (forward []int) {
	r := s.cluster.Ring()
	self := s.cluster.LocalMember().Name
	for _, j := range js {
		req := &c.reqs[j]
		owner, ok := r.Owner(req.Key)
		if !ok || owner.Name == self {
			s.setResult(c, j, s.globals.decideOwned(req), routeGlobal)
			continue
		}
		d, fwd := s.globals.decide(req, owner.Name)
		if fwd {
			forward = append(forward, j)
			continue
		}
		s.setResult(c, j, d, routeGlobal)
	}
	return forward
}

// run syncs every interval until ctx ends, then reports once more so that
// no admitted hit is lost on shutdown.
func (g *globals) run(ctx context.Context) error {
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			flush, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			g.report(flush)
			cancel()
			return nil
		case <-t.C:
			start := time.Now()
			g.report(ctx)
			g.broadcast(ctx)
			g.s.metrics.globalSyncLag.Observe(time.Since(start).Seconds())
		}
	}
}

// outgoing is reports on their way to one owner.
type outgoing struct {
	owner   ring.Member
	keys    []globalKey
	reports []*pb.GlobalReport
}

// report sends each entry's account to the counter's owner: hits admitted,
// grants wanted, grants released. Entries that went a whole round without
// a check give back their grant; entries with nothing left to say and a
// full counter are forgotten.
func (g *globals) report(ctx context.Context) {
	r := g.s.cluster.Ring()
	self := g.s.cluster.LocalMember().Name
	now := g.s.now()
	byOwner := map[string]*outgoing{}
	g.mu.Lock()
	for k, e := range g.entries {
		owner, ok := r.Owner(k.key)
		if !ok {
			continue
		}
		if owner.Name != e.owner {
			e.reown(owner.Name, g.newEpoch())
		}
		idle := !e.active
		e.active = false
		if idle && e.known && e.granted > e.admitted && e.admitted == e.sent {
			// Give the grant back; the next check here goes to the owner
			// and asks for a new one.
			e.granted = e.admitted
			e.epoch++
			e.release = true
			e.known = false
		}
		if e.admitted == e.sent && !e.want && !e.release {
			if idle && e.granted == e.admitted && !now.Before(e.resetAt) {
				delete(g.entries, k)
			}
			continue
		}
		o := byOwner[owner.Name]
		if o == nil {
			o = &outgoing{owner: owner}
			byOwner[owner.Name] = o
		}
		o.keys = append(o.keys, k)
		o.reports = append(o.reports, e.report())
	}
	g.mu.Unlock()

	var wg sync.WaitGroup
	for _, o := range byOwner {
		wg.Go(func() {
			if o.owner.Name == self {
				g.receive(self, o.reports) // this node became the owner
			} else if err := g.s.peers.AddGlobalHits(ctx, o.owner.PeerAddr, self, o.reports); err != nil {
				g.s.metrics.globalSendErrors.Inc()
				g.s.log.Warn("GLOBAL report not sent; it goes again next round", "owner", o.owner.Name, "err", err)
				return
			}
			g.delivered(o)
		})
	}
	wg.Wait()
}

func (e *globalEntry) report() *pb.GlobalReport {
	return &pb.GlobalReport{
		Item: &pb.CheckItem{
			Name: e.req.Name, Key: e.req.Key,
			Limit: e.req.Limit.Count, DurationMs: e.req.Limit.Period.Milliseconds(), Burst: e.req.Limit.Burst,
			Algorithm: pb.Algorithm(e.req.Algorithm), Behavior: pb.Behavior_GLOBAL,
		},
		Admitted: e.admitted, Acked: e.sent, Want: e.want, Release: e.release, Epoch: e.epoch,
	}
}

// delivered records that o's reports reached their owner.
func (g *globals) delivered(o *outgoing) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, k := range o.keys {
		e := g.entries[k]
		if e == nil || e.owner != o.owner.Name {
			continue
		}
		rep := o.reports[i]
		e.sent = max(e.sent, rep.Admitted)
		if rep.Release && rep.Epoch == e.epoch {
			e.release = false
		}
		if rep.Want {
			e.want = false
		}
	}
}

// receive takes node from's reports of counters this node owns: it
// charges the new hits and notes releases and wants for the next
// broadcast.
func (g *globals) receive(from string, reports []*pb.GlobalReport) {
	now := g.s.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, rep := range reports {
		r, err := toRequest(rep.GetItem(), now, g.s.skew)
		if err != nil {
			g.s.log.Warn("invalid GLOBAL report from a peer", "from", from, "err", err)
			continue
		}
		k := globalKey{r.Name, r.Key}
		l := g.lease(k, &r)
		n := l.nodes[from]
		switch {
		case n == nil || (rep.Epoch > n.epoch && !rep.Release):
			// A new account (the node forgot the old one, or this owner
			// did): what the node says was charged already is not charged
			// again, and the old account's grant is no longer reserved.
			n = &nodeLease{received: rep.Acked, granted: rep.Acked, epoch: rep.Epoch}
			l.nodes[from] = n
		case rep.Epoch < n.epoch:
			continue // from an account that has been replaced
		}
		if delta := rep.Admitted - n.received; delta > 0 {
			r.Hits = delta
			g.s.store.Charge(&r)
			n.received = rep.Admitted
		}
		if rep.Release && rep.Epoch > n.epoch {
			n.epoch = rep.Epoch
			n.granted = rep.Admitted
		}
		n.want = n.want || rep.Want
		g.dirty[k] = struct{}{}
	}
}

// broadcast hands the remaining hits of every owned counter that changed
// since the last round out as grants to the nodes that want them, and
// sends every node the new grants and state.
func (g *globals) broadcast(ctx context.Context) {
	r := g.s.cluster.Ring()
	members := int64(max(1, r.Len()))
	now := g.s.now()
	self := g.s.cluster.LocalMember().Name
	g.mu.Lock()
	// Forget the accounts of nodes no longer in the cluster; leases with
	// nothing lent and nothing asked that saw no check this round; and
	// leases of counters this node no longer owns (their nodes start
	// afresh with the new owner).
	inRing := map[string]bool{}
	for _, m := range r.Members() {
		inRing[m.Name] = true
	}
	for k, l := range g.leases {
		for name := range l.nodes {
			if !inRing[name] {
				delete(l.nodes, name) // a node that left or died uses no grant
			}
		}
		_, busy := g.dirty[k]
		owner, ok := r.Owner(k.key)
		if (ok && owner.Name != self) || (!busy && l.outstanding() == 0 && !l.wanted()) {
			delete(g.leases, k)
			delete(g.dirty, k)
		}
	}
	states := make([]*pb.GlobalState, 0, len(g.dirty))
	for k := range g.dirty {
		l := g.leases[k]
		delete(g.dirty, k)
		if l == nil {
			continue
		}
		peek := l.req
		peek.Now = now
		counter := g.s.store.Check(&peek)
		l.grant(counter.Remaining, members)
		one := peek
		one.Hits = 1
		st := &pb.GlobalState{
			Name: k.name, Key: k.key, Limit: l.req.Limit.Count, Members: members,
			Remaining:    max(0, counter.Remaining-l.outstanding()),
			ResetTimeMs:  now.Add(counter.ResetAfter).UnixMilli(),
			RetryAfterMs: max(0, g.s.store.Check(&one).RetryAfter.Milliseconds()),
		}
		for name, n := range l.nodes {
			st.Grants = append(st.Grants, &pb.GlobalGrant{Node: name, Granted: n.granted, Epoch: n.epoch})
		}
		states = append(states, st)
	}
	g.mu.Unlock()
	if len(states) == 0 {
		return
	}
	var wg sync.WaitGroup
	for _, m := range r.Members() {
		if m.Name == self {
			continue
		}
		wg.Go(func() {
			if err := g.s.peers.UpdateGlobals(ctx, m.PeerAddr, states); err != nil {
				g.s.metrics.globalSendErrors.Inc()
				g.s.log.Warn("GLOBAL state not sent", "member", m.Name, "err", err)
			}
		})
	}
	wg.Wait()
}

// grant lends what remains of the counter, less what is lent already, to
// the nodes that want it: each gets at most an equal share of members, so
// that one busy node cannot take everything, and at least one hit while
// any remains.
func (l *lease) grant(remaining, members int64) {
	avail := remaining - l.outstanding()
	var wanting []string
	for name, n := range l.nodes {
		if n.want {
			wanting = append(wanting, name)
		}
	}
	slices.Sort(wanting)
	part := max(1, avail/members)
	for _, name := range wanting {
		n := l.nodes[name]
		give := min(part, max(0, avail))
		n.granted = max(n.granted, n.received) + give
		avail -= give
		n.want = false
	}
}

func (l *lease) wanted() bool {
	for _, n := range l.nodes {
		if n.want {
			return true
		}
	}
	return false
}

// applyStates takes an owner's broadcast: new grants for this node, and
// the counter's state.
func (g *globals) applyStates(states []*pb.GlobalState) {
	self := g.s.cluster.LocalMember().Name
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, st := range states {
		e := g.entries[globalKey{st.Name, st.Key}]
		if e == nil {
			continue // this node has not seen the key: nothing to renew
		}
		for _, gr := range st.Grants {
			if gr.Node == self && gr.Epoch == e.epoch {
				e.granted = max(e.granted, gr.Granted)
				e.known = true
			}
		}
		e.remaining = st.Remaining
		e.resetAt = time.UnixMilli(st.ResetTimeMs)
		e.retryAfter = time.Duration(st.RetryAfterMs) * time.Millisecond
	}
}
