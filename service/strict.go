package service

import (
	"context"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/heal"
)

// Strict mode is package strict's: this file applies its verdicts to a
// request's checks, refuses what it fences from escrow, and says a
// leaving node's last word.

// escrowRetry is the retry_after of a check refused for want of escrow: a
// suspicion's life, after which the owner is tried again.
const escrowRetry = heal.SuspectFor

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

// SayLeft is the last step of this node's shutdown in strict mode: it
// tells the members it left that it has (see custody.Custody.SayLeft),
// and returns how many took the word and how many did not.
func (s *Service) SayLeft(ctx context.Context) (told, fenced int) { return s.custody.SayLeft(ctx) }
