package global

import "time"

// Escrow: GLOBAL in strict mode (see package strict). A grant is then an
// escrow, hits the owner reserved for a node ahead of time, bounded in
// time as well as in hits: a node spends it for at most EscrowConfig.TTL
// after the owner last renewed it; an owner keeps the account of a node
// that left its ring reserved for EscrowConfig.Keep (it may be cut off,
// and spending); and an owner lends nothing while EscrowConfig.MayLend
// says no (it sees no quorum). See docs/design-global.md, "Escrow".

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
