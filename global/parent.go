package global

import (
	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/limiter"
)

// The parent of checks with a ceiling: a GLOBAL counter shared by every
// key that names it. Borrowed hits are decided against it (Borrow), from
// this node's grant or by the owner, so nodes never borrow more than it
// has; guaranteed hits are charged to it without asking (Force), from the
// grant while it lasts and beyond it as forced hits. The owner keeps
// forced hits it has no room for as the lease's debt, at most the
// counter's capacity, paid from room not lent out before it lends or
// admits anything else: charged only as far as there was room, they were
// forgotten, and a busy key was never cut back to its guarantee. A
// parent's grant is renewed every round (entry.endRound). The debt is the
// owner's alone. See docs/design-global.md, "Borrowing is two counters
// and a GLOBAL parent".

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
