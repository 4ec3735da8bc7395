package service

import "time"

// noteStandIn records whether c.reqs[j], decided here as a check relayed
// or re-planned to this node (route.landed), is decided for another
// owner: its key's owner in the ring it was routed by is not this node.
// It reports whether it is, so that the check is decided as a stand-in's
// (limiter.Request.StandIn), and its owner gets the counter back once it
// answers again (package heal).
func (s *Service) noteStandIn(c *call, j int) bool {
	owner, ok := c.ring.Owner(c.reqs[j].Key)
	if !ok || owner.Name == s.cluster.LocalMember().Name {
		return false
	}
	s.heal.StandIn(owner.PeerAddr, time.Now())
	return true
}
