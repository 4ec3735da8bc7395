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

// GLOBAL behaviour. Every node answers GLOBAL checks at once from local
// state; the owner holds the real counter. Every --global-sync each node
// sends the hits it admitted to the owners, which charge them and
// broadcast each counter's remaining hits to all nodes.
//
// The bound: between two broadcasts a node admits at most its share of
// the remaining hits the owner last reported. Shares are remaining/members,
// with the remainder going one each to the first members in ring order, so
// they add up to exactly what the owner reported and a burst spread over
// all nodes admits at most the limit. Before a node has heard of a key it
// assumes the counter is full. So the cluster over-admits only when the
// owner's state is stale: hits still in flight when the owner broadcast,
// or a key that other nodes had already spent when this node first saw it
// (at most this node's share of a full counter, once).

// globalKey identifies a counter without building a string.
type globalKey struct{ name, key string }

// globalEntry is this node's view of one GLOBAL counter.
type globalEntry struct {
	req        limiter.Request // the latest check's limit and algorithm
	remaining  int64           // the owner's last report
	share      int64           // what this node may admit between reports
	spent      int64           // admitted here and not in the last report
	pending    int64           // admitted here and not yet sent to the owner
	reset      bool            // a reset to send to the owner
	refresh    bool            // a check was refused: ask the owner for fresh state
	resetAt    time.Time       // when the counter is full again
	retryAfter time.Duration   // owner's estimate of the wait for one hit
}

// globals holds this node's GLOBAL counters and, as owner, the counters
// whose new state it must broadcast.
type globals struct {
	s        *Service
	interval time.Duration

	mu      sync.Mutex
	entries map[globalKey]*globalEntry
	dirty   map[globalKey]limiter.Request // owned counters changed since the last broadcast
}

func newGlobals(s *Service, interval time.Duration) *globals {
	return &globals{s: s, interval: interval, entries: make(map[globalKey]*globalEntry), dirty: make(map[globalKey]limiter.Request)}
}

// shareOfRemaining is member index idx's share of remaining among members.
func shareOfRemaining(remaining, members int64, idx int) int64 {
	share := remaining / members
	if int64(idx) < remaining%members {
		share++
	}
	return share
}

// position returns this node's index in the ring's member order and the
// number of members.
func (g *globals) position() (int, int64) {
	r := g.s.cluster.Ring()
	self := g.s.cluster.LocalMember().Name
	members := r.Members()
	idx := slices.IndexFunc(members, func(m ring.Member) bool { return m.Name == self })
	return max(idx, 0), int64(max(len(members), 1))
}

// decide answers a GLOBAL check from this node's share.
func (g *globals) decide(r *limiter.Request) algorithms.Decision {
	idx, members := g.position()
	k := globalKey{r.Name, r.Key}
	capacity := r.Limit.Capacity()
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.entries[k]
	if e == nil || r.Reset {
		if e == nil && len(g.entries) >= maxGlobalEntries {
			g.evictOne()
		}
		e = &globalEntry{remaining: capacity, share: shareOfRemaining(capacity, members, idx), resetAt: r.Now, reset: r.Reset}
		g.entries[k] = e
	}
	e.req = *r
	d := algorithms.Decision{ResetAfter: max(0, e.resetAt.Sub(r.Now))}
	switch {
	case r.Hits > capacity:
		d.RetryAfter = algorithms.Never
	case e.spent+r.Hits <= e.share:
		d.Allowed = true
		e.spent += r.Hits
		e.pending += r.Hits
	case e.remaining-e.spent >= r.Hits:
		// The cluster has room but this node's share is spent: the next
		// broadcast brings a new share.
		d.RetryAfter = g.interval
		e.refresh = true
	default:
		d.RetryAfter = max(e.retryAfter, g.interval)
		e.refresh = true
	}
	d.Remaining = max(0, e.remaining-e.spent)
	return d
}

// maxGlobalEntries bounds the GLOBAL counters a node tracks, whatever
// clients send.
const maxGlobalEntries = 100_000

// evictOne forgets one entry with no hits waiting to be sent (the map's
// order makes it a random one), or any entry if all have. g.mu is held.
func (g *globals) evictOne() {
	var victim *globalKey
	for k, e := range g.entries {
		victim = &k
		if e.pending == 0 {
			break
		}
	}
	if victim != nil {
		delete(g.entries, *victim)
	}
}

// decideGlobal decides c.reqs[js], which are GLOBAL.
func (s *Service) decideGlobal(c *call, js []int) {
	for _, j := range js {
		s.setResult(c, j, s.globals.decide(&c.reqs[j]), routeGlobal)
	}
}

// run syncs every interval until ctx ends, then flushes pending hits once
// more so that none is lost on shutdown.
func (g *globals) run(ctx context.Context) error {
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			flush, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			g.sendHits(flush)
			cancel()
			return nil
		case <-t.C:
			start := time.Now()
			g.sendHits(ctx)
			g.broadcast(ctx)
			g.s.metrics.globalSyncLag.Observe(time.Since(start).Seconds())
		}
	}
}

// outgoing is hits on their way to one owner.
type outgoing struct {
	owner ring.Member
	keys  []globalKey
	items []*pb.CheckItem
}

// sendHits sends every entry's pending hits (and resets and refresh
// requests) to the key's owner. Hits that cannot be sent stay pending for
// the next round. Idle entries whose counter is full again are dropped.
func (g *globals) sendHits(ctx context.Context) {
	r := g.s.cluster.Ring()
	now := g.s.now()
	byOwner := map[string]*outgoing{}
	g.mu.Lock()
	for k, e := range g.entries {
		if e.pending == 0 && !e.reset && !e.refresh {
			// Forget an entry once the owner has reported everything
			// admitted here (spent is 0) and the counter is full again.
			if e.spent == 0 && !now.Before(e.resetAt) {
				delete(g.entries, k)
			}
			continue
		}
		owner, ok := r.Owner(k.key)
		if !ok {
			continue
		}
		o := byOwner[owner.Name]
		if o == nil {
			o = &outgoing{owner: owner}
			byOwner[owner.Name] = o
		}
		o.keys = append(o.keys, k)
		o.items = append(o.items, hitItem(e))
	}
	g.mu.Unlock()

	self := g.s.cluster.LocalMember().Name
	var wg sync.WaitGroup
	for _, o := range byOwner {
		wg.Go(func() {
			if o.owner.Name == self {
				g.applyHits(o.items)
			} else if err := g.s.peers.AddGlobalHits(ctx, o.owner.PeerAddr, o.items); err != nil {
				g.s.metrics.globalHitErrors.Inc()
				g.s.log.Warn("GLOBAL hits not sent; keeping them for the next sync", "owner", o.owner.Name, "err", err)
				return
			}
			g.sent(o)
		})
	}
	wg.Wait()
}

// hitItem is the check item that carries e's pending hits to the owner.
func hitItem(e *globalEntry) *pb.CheckItem {
	hits := e.pending
	return &pb.CheckItem{
		Name: e.req.Name, Key: e.req.Key, Hits: &hits,
		Limit: e.req.Limit.Count, DurationMs: e.req.Limit.Period.Milliseconds(), Burst: e.req.Limit.Burst,
		Algorithm: pb.Algorithm(e.req.Algorithm), Behavior: pb.Behavior_GLOBAL, Reset_: e.reset,
	}
}

// sent records that o reached its owner.
func (g *globals) sent(o *outgoing) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, k := range o.keys {
		if e := g.entries[k]; e != nil {
			e.pending -= o.items[i].GetHits()
			e.reset = e.reset && !o.items[i].Reset_
			e.refresh = false
		}
	}
}

// applyHits charges hits that nodes admitted for GLOBAL counters this node
// owns, and marks the counters for broadcast.
func (g *globals) applyHits(items []*pb.CheckItem) {
	now := g.s.now()
	for _, item := range items {
		r, err := toRequest(item, now, g.s.skew)
		if err != nil {
			g.s.log.Warn("invalid GLOBAL hits from a peer", "err", err)
			continue
		}
		if r.Reset {
			reset := r
			reset.Hits = 0
			g.s.store.Decide(&reset)
			r.Reset = false
		}
		if r.Hits > 0 {
			g.s.store.Charge(&r)
		}
		r.Hits = 0
		g.mu.Lock()
		g.dirty[globalKey{r.Name, r.Key}] = r
		g.mu.Unlock()
	}
}

// broadcast sends the state of every owned counter that changed since the
// last broadcast to every node, this one included.
func (g *globals) broadcast(ctx context.Context) {
	g.mu.Lock()
	dirty := g.dirty
	g.dirty = make(map[globalKey]limiter.Request)
	g.mu.Unlock()
	if len(dirty) == 0 {
		return
	}
	r := g.s.cluster.Ring()
	now := g.s.now()
	states := make([]*pb.GlobalState, 0, len(dirty))
	for _, req := range dirty {
		req.Now = now
		peek := g.s.store.Check(&req)
		req.Hits = 1
		one := g.s.store.Check(&req)
		states = append(states, &pb.GlobalState{
			Name: req.Name, Key: req.Key, Limit: req.Limit.Count, Members: int64(r.Len()),
			Remaining:    peek.Remaining,
			ResetTimeMs:  now.Add(peek.ResetAfter).UnixMilli(),
			RetryAfterMs: max(0, one.RetryAfter.Milliseconds()),
		})
	}
	self := g.s.cluster.LocalMember().Name
	var wg sync.WaitGroup
	for _, m := range r.Members() {
		if m.Name == self {
			g.applyStates(states)
			continue
		}
		wg.Go(func() {
			if err := g.s.peers.UpdateGlobals(ctx, m.PeerAddr, states); err != nil {
				g.s.metrics.globalHitErrors.Inc()
				g.s.log.Warn("GLOBAL state not sent", "member", m.Name, "err", err)
			}
		})
	}
	wg.Wait()
}

// applyStates takes the owners' broadcast state: each entry's share is
// renewed from the reported remaining hits.
func (g *globals) applyStates(states []*pb.GlobalState) {
	idx, members := g.position()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, st := range states {
		k := globalKey{st.Name, st.Key}
		e := g.entries[k]
		if e == nil {
			continue // this node has not seen the key: nothing to renew
		}
		e.remaining = st.Remaining
		e.spent = e.pending // hits not yet sent are not in the report
		e.share = shareOfRemaining(st.Remaining, members, idx)
		e.resetAt = time.UnixMilli(st.ResetTimeMs)
		e.retryAfter = time.Duration(st.RetryAfterMs) * time.Millisecond
	}
}
