package global

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// The side of a node that holds grants for counters others own.

// entry is this node's account with the owner of a counter it does not own.
type entry struct {
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
	renewed    time.Time       // when the owner last renewed the grant (escrow.go)
	resetAt    time.Time       // when the counter is full again
	retryAfter time.Duration   // owner's estimate of the wait for one hit
	// forced is the hits charged here beyond the grant, in all: the
	// guaranteed hits of checks whose parent the counter is (see Force),
	// which the owner charges whatever the grant. forcedSent is how many
	// of them the owner has acknowledged.
	forced, forcedSent int64
	// parent: the counter is the parent of checks with a ceiling (Borrow,
	// Force), whose unused grant is renewed every round (see endRound).
	parent bool
}

// epochGap leaves room for this many releases in one entry's epochs
// before the next entry's.
const epochGap = 1 << 20

// newEpoch returns the first epoch of a new entry: larger than any epoch
// this process used before, and than those of earlier processes (it starts
// from the wall clock, not the injected one), so that an owner can tell a
// new account from an old one.
func (n *Node) newEpoch() int64 {
	for {
		last := n.lastEpoch.Load()
		next := max(last+epochGap, time.Now().UnixNano())
		if n.lastEpoch.CompareAndSwap(last, next) {
			return next
		}
	}
}

// maxEntriesPerShard bounds the GLOBAL counters a node tracks for others
// (100,000 in all), whatever clients send.
const maxEntriesPerShard = 100_000 / numShards

func (n *Node) decideFromGrant(r *limiter.Request, owner string, parent bool) (d algorithms.Decision, forward bool) {
	k := key{r.Name, r.Key}
	sh := n.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := n.entry(sh, k, r, owner, parent)
	if !e.known || r.Reset || !n.spendable(e, n.now()) {
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
		d.RetryAfter = max(e.retryAfter, n.interval)
		e.want = true
	}
	return d, false
}

// entry returns the account of k, whose owner is owner, creating it (and
// making room for it) if needed, with r as its latest check; parent marks
// it a parent's. sh.mu is held.
func (n *Node) entry(sh *shard, k key, r *limiter.Request, owner string, parent bool) *entry {
	e := sh.entries[k]
	if e == nil {
		if len(sh.entries) >= maxEntriesPerShard {
			sh.evictOne()
		}
		e = &entry{owner: owner, epoch: n.newEpoch()}
		sh.entries[k] = e
	}
	e.req = *r
	e.active = true
	e.parent = e.parent || parent
	if e.owner != owner {
		e.reown(owner, n.newEpoch())
	}
	return e
}

// reown starts a new account for e with a new owner: hits not yet
// reported, from a grant or forced, go to the new owner as this node's
// first report.
func (e *entry) reown(owner string, epoch int64) {
	unsent := e.admitted - e.sent
	*e = entry{req: e.req, owner: owner, epoch: epoch, admitted: unsent, granted: unsent, want: true, active: true,
		forced: e.forced - e.forcedSent, parent: e.parent}
}

// evictOne forgets an entry with nothing to report or hold (the map's
// order makes it a random one), or, if every entry has, any entry: its
// unreported hits are lost, and the owner keeps its grant reserved until
// this node's next account for the key replaces it. sh.mu is held.
func (sh *shard) evictOne() {
	for k, e := range sh.entries {
		if e.admitted == e.sent && e.granted == e.admitted && e.forced == e.forcedSent {
			delete(sh.entries, k)
			return
		}
	}
	for k := range sh.entries {
		delete(sh.entries, k)
		return
	}
}

// outgoing is reports on their way to one owner.
type outgoing struct {
	owner   ring.Member
	keys    []key
	reports []*peerpb.GlobalReport
}

// Report sends each entry's account to the counter's owner: hits admitted,
// grants wanted, grants released. Entries that went a whole round without
// a check give back their grant; entries with nothing left to say and a
// full counter are forgotten.
func (n *Node) Report(ctx context.Context) {
	r := n.cluster.Ring()
	self := n.cluster.LocalMember().Name
	now := n.now()
	byOwner := map[string]*outgoing{}
	for i := range n.shards {
		sh := &n.shards[i]
		sh.mu.Lock()
		for k, e := range sh.entries {
			owner, ok := r.Owner(k.key)
			if !ok {
				continue
			}
			if owner.Name != e.owner {
				e.reown(owner.Name, n.newEpoch())
			}
			send, forget := e.endRound(now)
			if forget {
				delete(sh.entries, k)
			}
			if !send {
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
		sh.mu.Unlock()
	}

	var wg sync.WaitGroup
	for _, o := range byOwner {
		wg.Go(func() {
			if o.owner.Name == self {
				n.receiveAll(self, o.reports, now) // this node became the owner (receiveAll promotes its replicas first)
			} else if err := n.peers.AddGlobalHits(ctx, o.owner.PeerAddr, self, o.reports); err != nil {
				n.metrics.sendErrors.Inc()
				n.log.Warn("GLOBAL report not sent; it goes again next round", "owner", o.owner.Name, "err", err)
				return
			}
			n.delivered(o)
		})
	}
	wg.Wait()
}

// endRound ends e's round: an entry idle for the whole round gives its
// grant back, and so does a parent's (see Borrow) every round, asking for
// a new one if it was used: so that no hit a parent lent outlives the
// round it was lent for, and borrowers spend no room that guaranteed hits
// charged since then have taken (see Force). It reports whether e has
// anything to tell its owner, and whether, having nothing to tell, it
// holds nothing worth keeping (no grant, and a counter that is full
// again).
func (e *entry) endRound(now time.Time) (send, forget bool) {
	idle := !e.active
	e.active = false
	if e.known && e.granted > e.admitted && (e.parent || idle && e.admitted == e.sent) {
		// Give the grant back; the next check here goes to the owner and
		// asks for a new one, as a parent does now if it was busy.
		e.granted = e.admitted
		e.epoch++
		e.release = true
		e.known = false
		e.want = e.want || e.parent && !idle
	}
	send = e.admitted != e.sent || e.forced != e.forcedSent || e.want || e.release
	return send, !send && idle && e.granted == e.admitted && !now.Before(e.resetAt)
}

func (e *entry) report() *peerpb.GlobalReport {
	return &peerpb.GlobalReport{
		Item: &pb.CheckItem{
			Name: e.req.Name, Key: e.req.Key,
			Limit: e.req.Limit.Count, DurationMs: e.req.Limit.Period.Milliseconds(), Burst: e.req.Limit.Burst,
			Algorithm: pb.Algorithm(e.req.Algorithm), Behavior: pb.Behavior_GLOBAL,
		},
		Admitted: e.admitted, Acked: e.sent, Want: e.want, Release: e.release, Epoch: e.epoch,
		Forced: e.forced, ForcedAcked: e.forcedSent,
	}
}

// delivered records that o's reports reached their owner.
func (n *Node) delivered(o *outgoing) {
	for i, k := range o.keys {
		sh := n.shard(k)
		sh.mu.Lock()
		if e := sh.entries[k]; e != nil && e.owner == o.owner.Name {
			rep := o.reports[i]
			e.sent = max(e.sent, rep.Admitted)
			e.forcedSent = max(e.forcedSent, rep.Forced)
			if rep.Release && rep.Epoch == e.epoch {
				e.release = false
			}
			if rep.Want {
				e.want = false
			}
		}
		sh.mu.Unlock()
	}
}

// Apply takes owner from's broadcast: new grants for this node, and the
// counters' state; and, for the keys this node would inherit from from,
// the grants of every node (see heir.go). It refuses the whole broadcast,
// with an error wrapping ErrUnknownSender, when from is not a member of
// this node's ring or is this node. It takes a state only for a key from
// owns under this node's ring, and only if the state is possible (see
// entry.checkState and shard.keepGrants): for a counter this node tracks,
// under the counter's limit; it rejects (logs, sampled, and counts) the
// others.
func (n *Node) Apply(from string, states []*peerpb.GlobalState) error {
	r := n.cluster.Ring()
	self := n.cluster.LocalMember().Name
	if from == self || !isMember(r, from) {
		return fmt.Errorf("from: %q: %w", from, ErrUnknownSender)
	}
	now := n.now()
	for _, st := range states {
		if err := checkStateID(st); err != nil {
			n.reject(kindState, reasonInvalid, from, err)
			continue
		}
		if owner, _ := r.Owner(st.Key); owner.Name != from {
			n.reject(kindState, reasonNotOwner, from, fmt.Errorf("state of %s/%s, whose owner is %q", st.Name, st.Key, owner.Name))
			continue
		}
		heir, _ := n.heirs.Heir(r, from, st.Key)
		k := key{st.Name, st.Key}
		sh := n.shard(k)
		sh.mu.Lock()
		err := n.apply(sh.entries[k], st, self, now) // no entry: this node has not seen the key, nothing to renew
		if err == nil && heir.Name == self {
			err = sh.keepGrants(k, from, st, r, now)
		}
		sh.mu.Unlock()
		if err != nil {
			n.reject(kindState, reasonInvalid, from, fmt.Errorf("state of %s/%s: %w", st.Name, st.Key, err))
		}
	}
	return nil
}

// apply takes one valid owner's state into e, if e is not nil. The shard's
// lock is held.
func (n *Node) apply(e *entry, st *peerpb.GlobalState, self string, now time.Time) error {
	if e == nil {
		return nil
	}
	if err := e.checkState(st, self, now, n.skew); err != nil {
		return err
	}
	for _, gr := range st.Grants {
		if gr.Node == self && gr.Epoch == e.epoch {
			e.granted = max(e.granted, gr.Granted)
			e.known, e.renewed = true, now
		}
	}
	e.remaining = st.Remaining
	e.resetAt = time.UnixMilli(st.ResetTimeMs)
	e.retryAfter = time.Duration(st.RetryAfterMs) * time.Millisecond
	return nil
}
