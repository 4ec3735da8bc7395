package global

import (
	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/limiter"
)

// The parent of checks with a ceiling.
//
// A check with a ceiling admits its guaranteed hits (within its own
// limit) whatever its parent has left, and borrows beyond them only while
// the parent has room (see package service). The parent is one counter
// for every key that names it, so one hot key of the cluster: it is a
// GLOBAL counter, and the two kinds of hits reach it two ways.
//
//   - Borrowed hits are decided against it (Borrow): from this node's
//     grant, or by the owner, exactly, as any GLOBAL check. So however
//     many nodes borrow, they never borrow more than the parent has.
//   - Guaranteed hits are charged to it without asking (Force): from
//     this node's grant while it lasts, so that they take the room this
//     node could have borrowed, and beyond it as forced hits, reported to
//     the owner with the next round.
//
// The owner owes the guaranteed hits it has no room for: it keeps them as
// the lease's debt, at most the counter's capacity, and charges them to
// the counter as it refills, before lending or admitting anything else.
// Charging only as far as the counter had room would forget them, and a
// bucket or a sliding window, which refill continuously, would then hand
// the room they should have taken to the borrowers, round after round: a
// busy key would keep borrowing while the others use their guarantees,
// and never be cut back to its own. A debt is paid only from room not
// lent out, so that no guaranteed hit takes room a node was granted.
//
// A parent's grant is renewed every round (entry.endRound): what it does
// not use is given back, so that no grant outlives the round it was lent
// for. So borrowing is exact but for the guaranteed hits of one round
// that other nodes admitted beyond their grants, which the owner learns
// of at the round's end. The debt is the owner's alone: a new owner (a
// ring change, a failover) starts without it.

// Borrow decides borrowed hits of the parent counter r names, whose key
// owner owns: as Decide does, but the counter is marked a parent's, whose
// grant is renewed every round.
func (n *Node) Borrow(r *limiter.Request, owner string) (d algorithms.Decision, forward bool) {
	if owner == n.cluster.LocalMember().Name {
		return n.decideOwned(r), false
	}
	return n.decideFromGrant(r, owner, true)
}

// Force charges r.Hits to the parent counter r names, whose key owner
// owns, whether it has room or not, and never forwards: the guaranteed
// hits of checks with a ceiling. As the owner, it owes them (see owe):
// charged at once as far as the counter has room not lent out, the rest
// owed; otherwise it takes them from this node's grant while it lasts and
// counts the rest as forced hits, which the next report carries to the
// owner, which owes them.
func (n *Node) Force(r *limiter.Request, owner string) {
	if r.Hits <= 0 {
		return
	}
	k := key{r.Name, r.Key}
	sh := n.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if owner == n.cluster.LocalMember().Name {
		n.owe(sh.lease(k, r, n.now()), r, r.Hits)
		sh.dirty[k] = struct{}{}
		return
	}
	e := n.entry(sh, k, r, owner, true)
	granted := int64(0)
	if e.known {
		granted = min(r.Hits, max(0, e.granted-e.admitted))
	}
	e.admitted += granted
	e.forced += r.Hits - granted
}
