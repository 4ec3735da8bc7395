package service

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/heal"
	"github.com/ringlimit/ringlimit/strict"
)

// Strict mode is package strict's: this file applies its verdicts to a
// request's checks, refuses what it fences from escrow, and says a
// leaving node's last word.

// escrowRetry is the retry_after of a check refused for want of escrow: a
// suspicion's life, after which the owner is tried again.
const escrowRetry = heal.SuspectFor

// gate applies strict mode (package strict) to the pending checks ps of c
// that this node would decide as their key's owner in view v: those
// refused are refused from escrow, and those whose counter is to be
// counted spent are charged first. LOCAL checks are this node's own, and
// not gated.
func (s *Service) gate(c *call, ps []pending, v *view) {
	if !s.strict.On() {
		return
	}
	now := s.now() // the server's clock, not a check's created_at_ms: a client cannot shorten a fence
	for k := range ps {
		p := &ps[k]
		if c.behavior(p.j) == pb.Behavior_LOCAL || !(p.next == nextHere || (p.next == nextOwner && v.owns(p.to))) {
			continue
		}
		r := &c.reqs[p.j]
		switch s.strict.Judge(r, c.behavior(p.j) == pb.Behavior_GLOBAL || c.borrowing(p.j) != nil, v.ring, v.self.Name, s.store.Holds, now) {
		case strict.Refuse:
			p.next = nextEscrow
		case strict.Charge:
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

// fromEscrow returns escrowed with the GLOBAL checks of ps added that
// global answered from this node's grant (v.global) while their owner
// cannot be reached (it is suspect, or this node lacks a quorum), by
// index into c.reqs: their answers are marked decided_by "escrow" (see
// markEscrow).
func (s *Service) fromEscrow(c *call, ps []pending, v *view, escrowed []int) []int {
	if !s.strict.On() || v.global == nil {
		return escrowed
	}
	cut := v.ring.Len() < s.strict.Quorum()
	for k, p := range ps {
		if v.global[k].decided && !v.owns(p.to) && p.next == nextOwner && (cut || s.heal.Suspect(p.to.PeerAddr)) {
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
// the ring it left its last word (see "A graceful leave"), so that the
// member decides the keys it took over from this node at once rather than
// after the fence. It sends none to a member whose keys' counters this
// node still holds (its hand-off did not finish), and none at all if the
// ring changed while it left: those keys stay fenced. It returns how many
// members took the word, and how many members it left did not. With
// strict mode off, or before Leave, it does nothing.
func (s *Service) SayLeft(ctx context.Context) (told, fenced int) {
	lv := s.leaving.Load()
	if !s.strict.On() || lv == nil || s.peers == nil {
		return 0, 0
	}
	self := s.cluster.LocalMember().Name
	r := s.cluster.Ring()
	if r.Has(self) || lv.moved || r.ID() != lv.without.ID() {
		s.log.Warn("strict mode: the ring changed while this node left, or it has not left gossip; its keys stay fenced at their new owners",
			"members", r.Len())
		return 0, r.Len()
	}
	held := map[string]bool{} // members whose keys' counters are here still
	for c := range s.store.Counters() {
		if o, ok := r.Owner(c.Key); ok {
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
				err := s.peers.HandOffLeft(budget, m.PeerAddr, self, r.ID())
				if err == nil {
					took.Add(1)
					return
				}
				t := time.NewTimer(leftRetry)
				select {
				case <-t.C:
				case <-budget.Done():
					t.Stop()
					s.log.Warn("strict mode: a member did not take this node's last word; it fences this node's keys",
						"member", m.Name, "err", err)
					return
				}
			}
		})
	}
	wg.Wait()
	told = int(took.Load())
	s.log.Info("strict mode: told the members this node has left", "told", told, "fenced", r.Len()-told)
	return told, r.Len() - told
}
