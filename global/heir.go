package global

import (
	"bytes"
	"fmt"
	"slices"
	"time"

	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/ring"
)

// The side of a node that would inherit counters others own. A key's heir
// keeps the grants of the owner's last broadcast that lent hits not yet
// reported used, so that should the owner crash those hits stay reserved:
// a failover is decided on the replica less what was lent (decideOwned),
// and once the ring drops the owner the heir's lease starts from the kept
// grants (shard.lease), each node's first report on a new account charged
// up to what its old one had left (receive). See docs/design-global.md,
// "The heir keeps the grants".

// heirLease is the grants of a counter this node would inherit, as its
// owner last broadcast them.
type heirLease struct {
	owner    string
	at       time.Time            // when the broadcast arrived, by this node's clock
	accounts map[string]nodeLease // by node: only those that lent hits not yet reported used
	// lessees are the lessees' accounts that lent hits not yet reported
	// used. They are kept as long as the nodes' grants are, heirLeaseTTL,
	// not for their own time-to-live: a lessee stops using its grant once
	// that runs out without a renewal, but it cannot report the hits it
	// admitted until then while the owner cannot be reached, which is
	// until the ring drops the owner, seconds later (see startFrom).
	lessees map[Lessee]lesseeAccount
}

// heirLeaseTTL is how long kept grants are trusted. Nodes give back a
// grant they do not use within a round, and reown theirs as soon as their
// ring drops the owner, so after a minute without a broadcast the grants
// no longer stand for hits anyone may admit.
const heirLeaseTTL = time.Minute

// maxHeirLeasesPerShard bounds the grants a node keeps as heir (100,000
// counters in all), whatever owners broadcast.
const maxHeirLeasesPerShard = 100_000 / numShards

// outstanding returns the hits h lent and not yet reported used, if h is
// not older than heirLeaseTTL at now, at most capacity: the counter's
// capacity under the check's limit, which no set of grants can exceed. A
// nil h has none.
func (h *heirLease) outstanding(capacity int64, now time.Time) int64 {
	if h == nil || now.Sub(h.at) > heirLeaseTTL {
		return 0
	}
	var out int64
	for _, a := range h.accounts {
		out += a.granted - a.received
	}
	for _, a := range h.lessees {
		out += a.outstanding()
	}
	return min(out, capacity)
}

// startFrom starts l's accounts from h's, as the new owner of the counter:
// what each node and lessee had left of its grant stays reserved, at most
// capacity in all (nodes in name order, then lessees in id order, so that
// every heir trims alike). A lessee's account lives for ttl from now: the
// lessee, which could not report while the owner could not be reached,
// has that long to report to this one.
func (l *lease) startFrom(h *heirLease, capacity int64, ttl time.Duration, now time.Time) {
	if h == nil || now.Sub(h.at) > heirLeaseTTL {
		return
	}
	names := make([]string, 0, len(h.accounts))
	for name := range h.accounts {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		a := h.accounts[name]
		a.granted = a.received + min(a.granted-a.received, max(0, capacity))
		capacity -= a.granted - a.received
		l.nodes[name] = &a
	}
	ids := make([]Lessee, 0, len(h.lessees))
	for id := range h.lessees {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b Lessee) int { return bytes.Compare(a[:], b[:]) })
	for _, id := range ids {
		a := h.lessees[id]
		a.granted = a.received + min(a.outstanding(), max(0, capacity))
		a.expires = now.Add(ttl)
		capacity -= a.outstanding()
		l.lessees[id] = &a
	}
}

// keepGrants keeps the grants of owner's state st, of which this node is
// the key's heir, in r: the accounts of members of r that lent hits not
// yet reported used. A state that lends nothing forgets what was kept. It
// returns an error, and keeps nothing, for grants that are not possible.
// sh.mu is held.
func (sh *shard) keepGrants(k key, owner string, st *peerpb.GlobalState, r *ring.Ring, now time.Time) error {
	h := &heirLease{owner: owner, at: now}
	if err := h.keepLessees(st.GetLessees()); err != nil {
		return err
	}
	for _, gr := range st.GetGrants() {
		if gr.GetEpoch() < 0 || gr.GetReceived() < 0 || gr.GetReceived() > gr.GetGranted() {
			return fmt.Errorf("grants: %q: received %d must be between 0 and granted %d, epoch %d not negative",
				gr.GetNode(), gr.GetReceived(), gr.GetGranted(), gr.GetEpoch())
		}
		if gr.GetGranted() == gr.GetReceived() || gr.GetNode() == owner || !r.Has(gr.GetNode()) {
			continue // nothing lent, or to no one who could admit it
		}
		if h.accounts == nil {
			h.accounts = map[string]nodeLease{}
		}
		h.accounts[gr.GetNode()] = nodeLease{granted: gr.GetGranted(), received: gr.GetReceived(), epoch: gr.GetEpoch()}
	}
	if len(h.accounts) == 0 && len(h.lessees) == 0 {
		sh.dropHeir(k)
		return nil
	}
	if grow := len(h.lessees) - len(sh.heirs[k].lesseesOrNil()); grow > 0 && sh.book.kept.Load()+int64(grow) > maxLeaseAccounts {
		return fmt.Errorf("lessees: %d more accounts would pass the %d this node keeps as heir", grow, maxLeaseAccounts)
	}
	if _, ok := sh.heirs[k]; !ok && len(sh.heirs) >= maxHeirLeasesPerShard {
		sh.forgetStaleHeirLeases(now)
		for k := range sh.heirs { // none was stale: forget any one (the map's order makes it a random one)
			if len(sh.heirs) < maxHeirLeasesPerShard {
				break
			}
			sh.dropHeir(k)
		}
	}
	sh.dropHeir(k)
	sh.heirs[k] = h
	sh.book.kept.Add(int64(len(h.lessees)))
	return nil
}

// dropHeir forgets the grants kept of k, if any. sh.mu is held.
func (sh *shard) dropHeir(k key) {
	if h := sh.heirs[k]; h != nil {
		sh.book.kept.Add(-int64(len(h.lessees)))
		delete(sh.heirs, k)
	}
}

// lesseesOrNil returns h's lessees; a nil h has none.
func (h *heirLease) lesseesOrNil() map[Lessee]lesseeAccount {
	if h == nil {
		return nil
	}
	return h.lessees
}

// forgetStaleHeirLeases forgets kept grants older than heirLeaseTTL.
// sh.mu is held.
func (sh *shard) forgetStaleHeirLeases(now time.Time) {
	for k, h := range sh.heirs {
		if now.Sub(h.at) > heirLeaseTTL {
			sh.dropHeir(k)
		}
	}
}

// keepLessees keeps the lessees' accounts of an owner's state: those that
// lent hits not yet reported used. It returns an error, and keeps nothing,
// for accounts that are not possible: more than a node holds, an id that
// is not 16 bytes or that repeats, counts out of order. (keepGrants bounds
// what a node keeps as heir in all.)
func (h *heirLease) keepLessees(grants []*peerpb.LesseeGrant) error {
	if len(grants) > maxLeaseAccounts {
		return fmt.Errorf("lessees: %d accounts, more than a node holds (%d)", len(grants), maxLeaseAccounts)
	}
	for _, gr := range grants {
		switch {
		case len(gr.GetLessee()) != len(Lessee{}):
			return fmt.Errorf("lessees: an id of %d bytes, want %d", len(gr.GetLessee()), len(Lessee{}))
		case gr.GetEpoch() < 0 || gr.GetReceived() < 0 || gr.GetReceived() > gr.GetGranted():
			return fmt.Errorf("lessees: received %d must be between 0 and granted %d, epoch %d not negative",
				gr.GetReceived(), gr.GetGranted(), gr.GetEpoch())
		}
		id := Lessee(gr.GetLessee())
		if _, ok := h.lessees[id]; ok {
			return fmt.Errorf("lessees: %x twice", id[:4])
		}
		if h.lessees == nil {
			h.lessees = map[Lessee]lesseeAccount{}
		}
		if gr.GetGranted() == gr.GetReceived() {
			continue // nothing lent (the owner sends none such)
		}
		h.lessees[id] = lesseeAccount{granted: gr.GetGranted(), received: gr.GetReceived(), epoch: gr.GetEpoch()}
	}
	return nil
}
