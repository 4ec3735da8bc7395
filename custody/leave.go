package custody

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/ring"
)

// leavingRing is the ring a leaving node routes by: base, the cluster's
// ring, without this node. moved says the cluster's ring has changed
// since Leave (see SayLeft).
type leavingRing struct {
	base, without *ring.Ring
	moved         bool
}

// Ring returns the ring this node routes checks and hands off counters
// by: the cluster's, or once Leave is called, the cluster's without this
// node.
func (c *Custody) Ring() *ring.Ring {
	r := c.cluster.Ring()
	lv := c.leaving.Load()
	if lv == nil || lv.base == r {
		if lv != nil {
			return lv.without
		}
		return r
	}
	self := c.cluster.LocalMember().Name
	if !r.Has(self) {
		return r // gossip has left too
	}
	c.leaveMu.Lock()
	defer c.leaveMu.Unlock()
	if lv = c.leaving.Load(); lv.base != r {
		lv = &leavingRing{base: r, without: r.Without(self), moved: true}
		c.leaving.Store(lv)
	}
	return lv.without
}

// Leaving reports whether Leave has been called.
func (c *Custody) Leaving() bool { return c.leaving.Load() != nil }

// routing is the view of the cluster that hand-off and replication get:
// the ring this node routes by.
type routing struct{ c *Custody }

func (v routing) Ring() *ring.Ring         { return v.c.Ring() }
func (v routing) LocalMember() ring.Member { return v.c.cluster.LocalMember() }
func (v routing) Ready() bool              { return v.c.cluster.Ready() }
func (v routing) Returning() []string      { return v.c.cluster.Returning() }

// Leave is the first step of this node's leaving the cluster, before
// HandOffAll and before it leaves gossip: from now on it routes every
// check as if it had left, and so hands every counter off, while the
// others still forward to it. It passes checks forwarded to it on to the
// keys' new owners (see Prepare), which hold the counters by then. So no
// key is ever decided on an empty counter while its counter is on its
// way: the others' rings drop this node only once its counters are with
// their owners.
//
// Leave returns once the decisions on the store under way when it was
// called are made (see deciding), so that the hand-off after it finds
// their counters charged.
func (c *Custody) Leave() {
	if c.leaving.Load() != nil {
		return
	}
	c.deciding.Lock()
	defer c.deciding.Unlock()
	c.leaveMu.Lock()
	defer c.leaveMu.Unlock()
	if c.leaving.Load() == nil {
		r := c.cluster.Ring()
		c.leaving.Store(&leavingRing{base: r, without: r.Without(c.cluster.LocalMember().Name)})
	}
}

// leftRetry is how often, and leftBudget how long at most, a leaving node
// offers its last word to a member that does not take it yet (its ring
// has the node still) or cannot be reached: gossip tells every member of
// a leave within a few of memberlist's rounds, 200 ms each on a LAN. A
// member that has not taken it by then fences the node's keys, as for a
// crash.
const (
	leftRetry  = 100 * time.Millisecond
	leftBudget = 2 * time.Second
)

// SayLeft is the last step of this node's shutdown in strict mode, once it
// has left gossip and closed its client and peer ports, so that it can
// neither decide a check nor take a counter again: it sends each member of
// the ring it left its last word (see docs/strict.md, "A graceful
// leave: no fence"), so that the member decides the keys it took over from this
// node at once rather than after the fence. It sends none to a member
// whose keys' counters this node still holds (its hand-off did not
// finish), and none at all if the ring changed while it left: those keys
// stay fenced. It returns how many members took the word, and how many
// members it left did not. With strict mode off, or before Leave, it does
// nothing.
func (c *Custody) SayLeft(ctx context.Context) (told, fenced int) {
	lv := c.leaving.Load()
	if !c.fence.On() || lv == nil || c.peers == nil {
		return 0, 0
	}
	self := c.cluster.LocalMember().Name
	r := c.cluster.Ring()
	if r.Has(self) || lv.moved || r.ID() != lv.without.ID() {
		c.log.Warn("strict mode: the ring changed while this node left, or it has not left gossip; its keys stay fenced at their new owners",
			"members", r.Len())
		return 0, r.Len()
	}
	held := map[string]bool{} // members whose keys' counters are here still
	for ct := range c.store.Counters() {
		if o, ok := r.Owner(ct.Key); ok {
			held[o.Name] = true
		}
	}
	budget, cancel := context.WithTimeout(ctx, leftBudget)
	defer cancel()
	var took atomic.Int64
	var wg sync.WaitGroup
	for _, m := range r.Members() {
		if held[m.Name] {
			continue
		}
		wg.Go(func() {
			for {
				err := c.peers.HandOffLeft(budget, m.PeerAddr, self, r.ID())
				if err == nil {
					took.Add(1)
					return
				}
				t := time.NewTimer(leftRetry)
				select {
				case <-t.C:
				case <-budget.Done():
					t.Stop()
					c.log.Warn("strict mode: a member did not take this node's last word; it fences this node's keys",
						"member", m.Name, "err", err)
					return
				}
			}
		})
	}
	wg.Wait()
	told = int(took.Load())
	c.log.Info("strict mode: told the members this node has left", "told", told, "fenced", r.Len()-told)
	return told, r.Len() - told
}
