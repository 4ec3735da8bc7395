package global

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// What crosses the peer port into GLOBAL is checked as strictly as a
// public check: the sender must be a member, reports and states must be
// possible, and a report is charged at most what its node could have
// admitted. What fails is logged (sampled), counted in
// ringlimit_peer_rejected_total{kind,reason}, and never merged.

// ErrUnknownSender is wrapped by the errors of Receive and Apply that
// refuse a whole request because its sender is not a member of the
// cluster (or, for Apply, is this node itself).
var ErrUnknownSender = errors.New("sender is not a member of the cluster")

// departedGrace is how long after a node left the ring its reports are
// still taken: a node shutting down leaves first and sends its last
// GLOBAL report after it has handed off its counters, within
// --shutdown-timeout (30s by default).
const departedGrace = time.Minute

// Kinds and reasons of rejected items, the labels of
// ringlimit_peer_rejected_total.
const (
	kindReport = "global_report"
	kindState  = "global_state"

	reasonInvalid   = "invalid"    // a field out of bounds or inconsistent
	reasonNotOwner  = "not_owner"  // a state from a node that does not own the key
	reasonOverGrant = "over_grant" // a report of more hits than the node could have admitted; charged in part
)

// members remembers when each member was last seen in the ring, so that a
// node that just left may still send its last reports. It is safe for
// concurrent use.
type members struct {
	mu   sync.Mutex
	seen map[string]time.Time
}

// observe records r's members as seen at now and forgets those gone for
// longer than departedGrace. Broadcast calls it every round.
func (m *members) observe(r *ring.Ring, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seen == nil {
		m.seen = map[string]time.Time{}
	}
	for _, mb := range r.Members() {
		m.seen[mb.Name] = now
	}
	for name, at := range m.seen {
		if now.Sub(at) > departedGrace {
			delete(m.seen, name)
		}
	}
}

// recent reports whether name was in the ring within departedGrace of now.
func (m *members) recent(name string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	at, ok := m.seen[name]
	return ok && now.Sub(at) <= departedGrace
}

// isMember reports whether name is a member of r.
func isMember(r *ring.Ring, name string) bool {
	return slices.ContainsFunc(r.Members(), func(m ring.Member) bool { return m.Name == name })
}

// checkReport checks a report's counts: none negative, and no more hits
// acknowledged than admitted. Its item, which must be there, is checked as
// a public check is (checks.Request).
func checkReport(rep *peerpb.GlobalReport) error {
	switch {
	case rep.GetItem() == nil:
		return errors.New("item: missing")
	case rep.GetEpoch() < 0:
		return fmt.Errorf("epoch: must not be negative, got %d", rep.GetEpoch())
	case rep.GetAdmitted() < 0:
		return fmt.Errorf("admitted: must not be negative, got %d", rep.GetAdmitted())
	case rep.GetAcked() < 0 || rep.GetAcked() > rep.GetAdmitted():
		return fmt.Errorf("acked: must be between 0 and admitted (%d), got %d", rep.GetAdmitted(), rep.GetAcked())
	case rep.GetForced() < 0:
		return fmt.Errorf("forced: must not be negative, got %d", rep.GetForced())
	case rep.GetForcedAcked() < 0 || rep.GetForcedAcked() > rep.GetForced():
		return fmt.Errorf("forced_acked: must be between 0 and forced (%d), got %d", rep.GetForced(), rep.GetForcedAcked())
	}
	return nil
}

// checkStateID checks a state's name and key against the bounds of a
// counter's identity.
func checkStateID(st *peerpb.GlobalState) error {
	switch {
	case st.GetName() == "" || len(st.GetName()) > limiter.MaxNameLen:
		return fmt.Errorf("name: %d bytes, want 1..%d", len(st.GetName()), limiter.MaxNameLen)
	case strings.IndexByte(st.GetName(), 0) >= 0:
		return errors.New("name: must not contain a NUL byte")
	case st.GetKey() == "" || len(st.GetKey()) > limiter.MaxKeyLen:
		return fmt.Errorf("key: %d bytes, want 1..%d", len(st.GetKey()), limiter.MaxKeyLen)
	}
	return nil
}

// checkState checks an owner's state of the counter e tracks, as seen
// from node self at now: counts within what e's limit allows, times within
// what it can take to refill (plus skew), and self's grant no larger than
// the limit beyond what self has admitted already.
func (e *entry) checkState(st *peerpb.GlobalState, self string, now time.Time, skew time.Duration) error {
	capacity := e.req.Limit.Capacity()
	ahead := refillTime(e.req.Limit)
	switch {
	case st.GetLimit() <= 0:
		return fmt.Errorf("limit: must be positive, got %d", st.GetLimit())
	case st.GetRemaining() < 0 || st.GetRemaining() > capacity:
		return fmt.Errorf("remaining: must be between 0 and the capacity %d, got %d", capacity, st.GetRemaining())
	case st.GetMembers() < 0:
		return fmt.Errorf("members: must not be negative, got %d", st.GetMembers())
	case st.GetResetTimeMs() < 0 || time.UnixMilli(st.GetResetTimeMs()).After(now.Add(ahead+skew)):
		return fmt.Errorf("reset_time_ms: %d is further than %v (refill and clock skew) after now", st.GetResetTimeMs(), ahead+skew)
	case st.GetRetryAfterMs() < 0 || time.Duration(st.GetRetryAfterMs())*time.Millisecond > ahead:
		return fmt.Errorf("retry_after_ms: must be between 0 and %d, got %d", ahead.Milliseconds(), st.GetRetryAfterMs())
	}
	for _, gr := range st.GetGrants() {
		if gr.GetNode() != self {
			continue
		}
		switch {
		case gr.GetEpoch() < 0:
			return fmt.Errorf("grants: epoch must not be negative, got %d", gr.GetEpoch())
		case gr.GetGranted() < 0 || gr.GetGranted()-e.admitted > capacity:
			return fmt.Errorf("grants: %d in all for %s, which has admitted %d: more than the capacity %d beyond that",
				gr.GetGranted(), self, e.admitted, capacity)
		}
	}
	return nil
}

// refillTime is the longest a counter under l can take to be full again:
// two periods (a sliding window's estimate lasts to the end of the next
// window), longer for a bucket whose burst exceeds its limit.
func refillTime(l algorithms.Limit) time.Duration {
	t := 2 * float64(l.Period)
	if c := l.Capacity(); c > l.Count && l.Count > 0 {
		t = t * float64(c) / float64(l.Count)
	}
	return time.Duration(min(t, math.MaxInt64/2))
}

// sampled thins out the log lines of rejected items: at most one a
// second, each saying how many were left out since the last.
type sampled struct {
	last    atomic.Int64 // Unix ns of the last line
	skipped atomic.Int64 // lines left out since
}

// reject counts one rejected item and logs it, sampled.
func (n *Node) reject(kind, reason, from string, err error) {
	n.metrics.rejected.WithLabelValues(kind, reason).Inc()
	now := time.Now().UnixNano()
	last := n.sampled.last.Load()
	if now-last < int64(time.Second) || !n.sampled.last.CompareAndSwap(last, now) {
		n.sampled.skipped.Add(1)
		return
	}
	n.log.Warn("peer item rejected", "kind", kind, "reason", reason, "from", from, "err", err,
		"left_out_since_last_line", n.sampled.skipped.Swap(0))
}
