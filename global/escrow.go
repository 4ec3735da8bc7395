package global

import "time"

// Escrow: GLOBAL in strict mode (see package service, strict.go).
//
// In strict mode a grant is an escrow: hits the owner reserved for a node
// ahead of time, which the node spends while it cannot reach the owner,
// and nothing else. GLOBAL reserves grants already (the owner lends and
// admits only what is not lent out); strict mode adds three rules, so that
// a node that another part of the cluster has stopped hearing from, and
// that may still be deciding, is bounded in time as well as in hits:
//
//   - A node spends a grant for at most EscrowConfig.TTL after the owner's
//     last word renewing it (a broadcast that carries it), by this node's
//     clock; after that it asks the owner, as it does with no grant.
//   - An owner keeps the account of a node that left its ring reserved for
//     EscrowConfig.Keep, not freeing it at its next round: the node may be
//     cut off rather than dead, and spending its grant, for up to TTL after
//     the owner's last broadcast reached it. A node that crashed holds its
//     share until then: the safe side.
//   - An owner lends nothing while EscrowConfig.MayLend says no (strict
//     mode: while it does not see a quorum of members), to nodes or
//     lessees, so that a cut-off owner does not hand out hits the rest of
//     the cluster will decide again once its fence has passed.

// EscrowConfig is strict mode's part of a Node's Config. Its zero value is
// GLOBAL's ordinary behaviour: grants last until spent, a node that leaves
// the ring frees its grant, and owners always lend.
type EscrowConfig struct {
	// TTL, if positive, is how long after the owner's last word a grant
	// may be spent.
	TTL time.Duration
	// Keep, if positive, is how long an owner keeps a departed node's
	// grant reserved; it must exceed TTL and a broadcast's flight.
	Keep time.Duration
	// MayLend, if not nil, reports whether this node may lend now.
	MayLend func() bool
}

// mayLend reports whether n may lend now (EscrowConfig.MayLend).
func (n *Node) mayLend() bool { return n.escrow.MayLend == nil || n.escrow.MayLend() }

// spendable reports whether e's grant may be spent at now: always, unless
// an escrow TTL has run out since the owner last renewed it.
func (n *Node) spendable(e *entry, now time.Time) bool {
	return n.escrow.TTL <= 0 || now.Sub(e.renewed) <= n.escrow.TTL
}

// departed reports whether the account nl, of a node that is not in the
// ring at now, is to be forgotten: at once by default, after Keep in
// strict mode (the time it left is marked on the first call).
func (n *Node) departed(nl *nodeLease, now time.Time) bool {
	if n.escrow.Keep <= 0 {
		return true
	}
	if nl.goneAt.IsZero() {
		nl.goneAt = now
	}
	return now.Sub(nl.goneAt) > n.escrow.Keep
}
