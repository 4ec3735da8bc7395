package service

import (
	"time"

	"github.com/ringlimit/ringlimit/top"
)

// Every check this node decides (on its store as the key's owner, from
// GLOBAL's lease, or with its share when the owner is unreachable) is
// counted once, where ringlimit_checks_total counts it (setResult,
// setDecided), so that the sum of the nodes' reports counts each check
// once: a forwarded check is counted by the owner that decided it.

// Top reports what this node's tracker counted as of now, with at most
// keys keys per list; a node without a tracker reports nothing but its
// interval.
func (s *Service) Top(keys int) top.Report {
	if s.top == nil {
		return top.Report{Seconds: top.DefaultWindow.Seconds()}
	}
	return s.top.Report(s.now(), keys)
}

// ReplicationLag is how long ago this node's last replication round that
// delivered every batch began (see custody.Custody.ReplicationLag); zero
// when this node replicates nothing.
func (s *Service) ReplicationLag() time.Duration { return s.custody.ReplicationLag() }

// Top answers another node's Peer/Top with Service.Top.
func (o Owner) Top(keys int) top.Report { return o.s.Top(keys) }

// ReplicationLag answers another node's Peer/Top with
// Service.ReplicationLag.
func (o Owner) ReplicationLag() time.Duration { return o.s.ReplicationLag() }
