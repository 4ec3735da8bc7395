package service

import (
	"context"
	"sync"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// After a heal. A member that decides an unreachable owner's keys by
// failover (its heir, or the next member of a key's succession in a
// partition) does so on a counter of its own, for a key it does not own.
// Nothing took that counter back to the owner but the next ring change:
// after a freeze, or a partition too short for the rings to drop the
// owner, the owner went on from its own counter, not counting what its
// stand-in had admitted meanwhile. So a stand-in remembers the owners it
// decided for (standIns), and once such an owner answers again and no
// check has come for it by failover for standInQuiet, it runs a round of
// hand-off, which gives every counter it holds for a key it does not own
// to that key's owner. The stand-in decided those checks as a stand-in's
// (limiter.Request.StandIn), so each counter carries the hits it charged
// standing in, and the owner adds them to its own counter rather than keep
// the more charged of the two (limiter.Store.Merge): after a partition,
// in which both sides admitted from one starting state, the owner's
// counter counts what both admitted.

// standInQuiet is how long after its last failover decision for an owner
// a stand-in waits before it gives that owner's counters back: other
// nodes may still relay the owner's keys here until their own suspicion
// ends (a probe every probeEvery; their connections come back within
// about two seconds of the owner answering again, see package peer), and
// each such check would take the counter back from the replica again.
const standInQuiet = time.Second

// standIns are the owners (by peer address) whose keys this node decided
// by failover, each with the time of the last such decision, timed by the
// real clock as suspicions are. It is safe for concurrent use.
type standIns struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// note records a failover decision for the owner at addr now.
func (st *standIns) note(addr string, now time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.last == nil {
		st.last = make(map[string]time.Time)
	}
	st.last[addr] = now
}

// quiet returns the owners for which no failover decision came for
// standInQuiet before now.
func (st *standIns) quiet(now time.Time) []string {
	st.mu.Lock()
	defer st.mu.Unlock()
	var addrs []string
	for addr, last := range st.last {
		if now.Sub(last) >= standInQuiet {
			addrs = append(addrs, addr)
		}
	}
	return addrs
}

// done forgets addr, unless a failover decision for it came after since.
func (st *standIns) done(addr string, since time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if last, ok := st.last[addr]; ok && !last.After(since) {
		delete(st.last, addr)
	}
}

// forget drops the owners that are not in members (they left the ring:
// the next ring change hands their keys' counters to the new owners).
func (st *standIns) forget(members map[string]bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for addr := range st.last {
		if !members[addr] {
			delete(st.last, addr)
		}
	}
}

// noteStandIn records whether c.reqs[j], decided here as a check relayed
// or re-planned to this node (route.landed), is decided for another
// owner: its key's owner in the ring it was routed by is not this node.
// It reports whether it is, so that the check is decided as a stand-in's
// (limiter.Request.StandIn).
func (s *Service) noteStandIn(c *call, j int) bool {
	owner, ok := c.ring.Owner(c.reqs[j].Key)
	if !ok || owner.Name == s.cluster.LocalMember().Name {
		return false
	}
	s.standIns.note(owner.PeerAddr, s.suspects.now())
	return true
}

// giveBack is one round of the stand-in's part of a heal: it probes each
// owner it decided for, and quiet for standInQuiet; an owner that answers
// gets back the counters of its keys held here (a round of hand-off), and
// one that does not is suspect. members are the peer addresses in the
// ring.
func (s *Service) giveBack(ctx context.Context, members map[string]bool) {
	s.standIns.forget(members)
	start := s.suspects.now()
	handBack := false
	for _, addr := range s.standIns.quiet(start) {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		_, err := s.peers.ForwardNow(pctx, addr, &pb.CheckRequest{})
		cancel()
		switch {
		case err == nil:
			s.standIns.done(addr, start)
			handBack = true
		case failed(ctx, err):
			s.suspects.mark(addr)
			s.resetPeer(addr)
		}
	}
	if handBack {
		s.handoff.RingChanged() // no ring change: a round that finds these counters not this node's
	}
}

// resetter is what Peers may also do: close a connection that gRPC holds
// ready but on which a call timed out (peer.Pool.Reset).
type resetter interface{ Reset(addr string) bool }

// resetPeer resets the connection to the owner at addr, whose probe has
// just failed, if the peers can: a connection left established across a
// network cut may stay stuck for many seconds after the cut heals, while
// a new one would answer at once (see peer.Pool.Reset). The next probe
// dials afresh.
func (s *Service) resetPeer(addr string) {
	if r, ok := s.peers.(resetter); ok {
		r.Reset(addr)
	}
}
