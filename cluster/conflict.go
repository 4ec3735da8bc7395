package cluster

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"

	"github.com/hashicorp/memberlist"
)

// ErrNameTaken is returned by Run when another live member has this node's
// name.
var ErrNameTaken = errors.New("node name taken by a live member")

// conflicts is the memberlist ConflictDelegate. memberlist calls it, with
// its node lock held, when a node claims a name it knows at another
// address; it keeps that name for the member it knows, so the newcomer is
// ignored by the others. conflicts only records the last address that
// claimed this node's own name, for Run to check after joining.
type conflicts struct {
	self string

	mu    sync.Mutex
	other *net.UDPAddr // nil: none since the last take
}

func (c *conflicts) NotifyConflict(existing, other *memberlist.Node) {
	if other.Name != c.self {
		return // two other nodes claim one name; memberlist logs it
	}
	c.mu.Lock()
	c.other = &net.UDPAddr{IP: slices.Clone(other.Addr), Port: int(other.Port)}
	c.mu.Unlock()
}

// take returns the address recorded since the last call, or nil.
func (c *conflicts) take() *net.UDPAddr {
	c.mu.Lock()
	defer c.mu.Unlock()
	addr := c.other
	c.other = nil
	return addr
}

// checkName runs after this node first joins. If a member answered the
// join under this node's name from another address and still answers a
// ping there, the name is taken: the caller must stop without leaving,
// since a leave under this name would mark that member gone. A member that
// does not answer is a crashed earlier run of this node, which the others
// will declare dead (see DeadNodeReclaimTime).
func (c *Cluster) checkName(ml *memberlist.Memberlist) error {
	addr := c.conflicts.take()
	if addr == nil {
		return nil
	}
	if _, err := ml.Ping(c.conf.NodeName, addr); err != nil {
		c.log.Warn("this node's name is held by a member that does not answer: waiting for it to be declared dead",
			"node", c.conf.NodeName, "other", addr.String(), "err", err)
		return nil
	}
	return fmt.Errorf("join cluster: %q is taken by a live member at %s, so this node does not serve: give it another --node-name: %w",
		c.conf.NodeName, addr, ErrNameTaken)
}
