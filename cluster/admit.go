package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Admission binds membership to identity: gossip tells a node who claims
// to be a member and where its peer port is, and Config.Admit checks the
// claim (package node checks the certificate on the peer port). A member
// not admitted is left out of the ring and Member does not report it.
// Each node checks every other itself. The Run goroutine owns admission:
// at most maxAdmitting checks at once, each within admitTimeout, their
// verdicts on a channel. A member that fails is checked again while gossip
// says it is alive, after admitRetry doubling up to admitRetryMax when
// refused, and up to unreachableRetryMax when the check said nothing of
// who it is. A member admitted once that announces a new peer address
// stays in the ring while the new address cannot be checked (see kept).
// See docs/design-cluster.md, "Membership and the ring".
type admission struct {
	states   map[string]*admitState
	verdicts chan verdict
	inFlight int
	// other says a member other than this node has been admitted since
	// Run started (see Cluster.Readiness).
	other bool
}

// admitState is what admission knows of one member.
type admitState struct {
	peerAddr string    // the peer address checked, or being checked
	ok       bool      // peerAddr passed
	checking bool      // a check is in flight
	failures int       // checks of peerAddr failed in a row
	next     time.Time // when a failed member is checked again
	since    time.Time // when peerAddr was first to be checked
	err      error     // the last check's failure, nil before one
	// proven says the member passed a check at an earlier address and
	// has not been refused since (see kept).
	proven bool
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
	// unreachableRetryMax bounds the backoff of a member whose checks
	// failed without a verdict on its identity.
	unreachableRetryMax = 5 * time.Second
	// DefaultAdmitGrace is the zero Config.AdmitGrace.
	DefaultAdmitGrace = 10 * time.Second
)

// refused marks an Admit error as a verdict on the member's identity.
type refused struct{ error }

func (r refused) Unwrap() error { return r.error }

// Refused marks err, returned by Config.Admit, as a verdict on who the
// member is (a certificate that does not name it, one from another CA, a
// name outside the allowed pattern), as opposed to a check that could not
// be made: such a member is checked again slowly, since only a new
// certificate or setting will change the answer. Its text is err's.
func Refused(err error) error {
	if err == nil {
		return nil
	}
	return refused{err}
}

// IsRefused reports whether err was marked by Refused.
func IsRefused(err error) bool {
	var r refused
	return errors.As(err, &r)
}

func newAdmission() *admission {
	return &admission{states: make(map[string]*admitState), verdicts: make(chan verdict, maxAdmitting)}
}

// admitted reports whether the member name, announcing peerAddr, has
// passed the check for that address.
func (a *admission) admitted(name, peerAddr string) bool {
	s, ok := a.states[name]
	return ok && s.ok && s.peerAddr == peerAddr
}

// kept reports whether the member name, announcing peerAddr, which has
// not passed the check for that address, stays in the ring meanwhile: it
// passed at an earlier address (the one its state still holds, until
// startAdmission turns to the new one), and no check has refused it since.
func (a *admission) kept(name, peerAddr string) bool {
	s, ok := a.states[name]
	if !ok {
		return false
	}
	if s.peerAddr != peerAddr {
		return s.ok || s.proven
	}
	return !s.ok && s.proven
}

// note says why the alive member name, announcing peerAddr, is not in the
// ring, or is on its earlier proof, as MemberInfo.Admission does; "" if
// it is admitted.
func (a *admission) note(name, peerAddr string) string {
	s, ok := a.states[name]
	switch {
	case ok && s.ok && s.peerAddr == peerAddr:
		return ""
	case ok && s.proven && s.peerAddr == peerAddr:
		msg := "in the ring on its proof at an earlier peer address, checking the new one"
		if s.err != nil {
			msg += fmt.Sprintf(", retrying (%d checks failed): %v", s.failures, s.err)
		}
		return msg
	case !ok || s.peerAddr != peerAddr || s.err == nil:
		return "not admitted yet: checking its peer port"
	case IsRefused(s.err):
		return "not admitted: " + s.err.Error()
	default:
		return fmt.Sprintf("not admitted, retrying (%d checks failed): %v", s.failures, s.err)
	}
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
				*s = admitState{peerAddr: addr, since: now, proven: s.ok || s.proven}
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

// takeVerdict records v.
func (c *Cluster) takeVerdict(v verdict, now time.Time) {
	a := c.admission
	a.inFlight--
	s := a.states[v.name]
	if s == nil {
		return // forgotten meanwhile
	}
	s.checking = false
	if s.peerAddr != v.peerAddr {
		return // moved meanwhile: the new address is checked next
	}
	if v.err == nil {
		s.ok, s.proven, s.failures, s.err = true, false, 0, nil
		a.other = true
		c.log.Info("member admitted to the ring", "node", v.name, "peer_addr", v.peerAddr)
		return
	}
	c.metrics.admitFailures.Inc()
	limit, fix := unreachableRetryMax, "make its peer port reachable from this node; it is checked again until it answers"
	if IsRefused(v.err) {
		limit, fix = admitRetryMax, "give it a certificate from the cluster CA that names it, and a name that --member-names allows"
		s.proven = false
	}
	backoff := min(admitRetry<<min(s.failures, 5), limit)
	s.failures++
	s.err = v.err
	s.next = now.Add(backoff)
	c.log.Warn("member not admitted to the ring: its peer port did not prove its name", "node", v.name,
		"peer_addr", v.peerAddr, "err", v.err, "fix", fix, "retry_in", backoff, "kept_in_ring", s.proven)
}
