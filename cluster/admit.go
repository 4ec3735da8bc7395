package cluster

import (
	"context"
	"time"
)

// Admission binds membership to identity: gossip tells a node who claims
// to be a member and where its peer port is, and Config.Admit checks the
// claim (package node dials the peer port over mutual TLS and checks that
// the certificate it presents names the member). A node that has not
// passed the check is left out of the ring, so it owns no keys, is handed
// no counters and is sent no checks, and Member does not report it, so
// its peer calls are refused. Each node checks every other itself: no
// member's word admits another.
//
// The Run goroutine owns admission: it starts the checks, at most
// maxAdmitting at once, each bounded by admitTimeout, and takes their
// verdicts from a channel; a member that fails is checked again after a
// backoff (admitRetry doubling up to admitRetryMax) for as long as gossip
// says it is alive.
type admission struct {
	states   map[string]*admitState
	verdicts chan verdict
	inFlight int
}

// admitState is what admission knows of one member.
type admitState struct {
	peerAddr string    // the peer address checked, or being checked
	ok       bool      // peerAddr passed
	checking bool      // a check is in flight
	failures int       // checks of peerAddr failed in a row
	next     time.Time // when a failed member is checked again
}

type verdict struct {
	name, peerAddr string
	err            error
}

const (
	maxAdmitting  = 16
	admitTimeout  = 5 * time.Second
	admitRetry    = time.Second
	admitRetryMax = 30 * time.Second
)

func newAdmission() *admission {
	return &admission{states: make(map[string]*admitState), verdicts: make(chan verdict, maxAdmitting)}
}

// admitted reports whether the member name, announcing peerAddr, has
// passed the check for that address.
func (a *admission) admitted(name, peerAddr string) bool {
	s, ok := a.states[name]
	return ok && s.ok && s.peerAddr == peerAddr
}

// startAdmission begins the checks that are due: of each alive member in want (name
// -> peer address) that has not passed for its address, none is in flight
// and its backoff has passed. It forgets the members not in known.
func (c *Cluster) startAdmission(ctx context.Context, want map[string]string, known map[string]bool, now time.Time) {
	a := c.admission
	for name := range a.states {
		if !known[name] {
			delete(a.states, name)
		}
	}
	for name, addr := range want {
		s := a.states[name]
		if s == nil {
			s = &admitState{}
			a.states[name] = s
		}
		if s.peerAddr != addr { // new, or moved: check the new address
			if !s.checking {
				*s = admitState{peerAddr: addr}
			}
		}
		if s.ok || s.checking || now.Before(s.next) || a.inFlight >= maxAdmitting {
			continue
		}
		s.checking = true
		a.inFlight++
		go func() {
			cctx, cancel := context.WithTimeout(ctx, admitTimeout)
			defer cancel()
			err := c.conf.Admit(cctx, name, addr)
			a.verdicts <- verdict{name: name, peerAddr: addr, err: err} // cap maxAdmitting: never blocks
		}()
	}
}

// firstPending reports whether a member is being checked, or waits to be,
// that has not failed a check yet (see Cluster.finishJoin).
func (a *admission) firstPending() bool {
	for _, s := range a.states {
		if !s.ok && s.failures == 0 {
			return true
		}
	}
	return false
}

// takeVerdict records v, and reports whether it changed who is admitted.
func (c *Cluster) takeVerdict(v verdict, now time.Time) bool {
	a := c.admission
	a.inFlight--
	s := a.states[v.name]
	if s == nil {
		return false // forgotten meanwhile
	}
	s.checking = false
	if s.peerAddr != v.peerAddr {
		return false // moved meanwhile: the new address is checked next
	}
	if v.err == nil {
		s.ok, s.failures = true, 0
		c.log.Info("member admitted to the ring", "node", v.name, "peer_addr", v.peerAddr)
		return true
	}
	c.metrics.admitFailures.Inc()
	backoff := admitRetry << min(s.failures, 5)
	s.failures++
	s.next = now.Add(min(backoff, admitRetryMax))
	c.log.Warn("member not admitted to the ring: its peer port did not prove its name", "node", v.name,
		"peer_addr", v.peerAddr, "err", v.err, "retry_in", min(backoff, admitRetryMax))
	return false
}
