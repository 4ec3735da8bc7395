package service

import (
	"context"
	"strings"
	"sync"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// Hand-off: when the ring changes, counters this node holds for keys it no
// longer owns go to their new owner, which merges them (the more charged
// state wins), so that scaling out or a rolling restart does not reset
// limits. A counter travels as limiter.Counter's versioned record; the new
// owner validates it and says, per counter, which it refused and why, and
// the sender keeps those.

// handOffBatch is the most counters sent in one HandOff RPC.
const handOffBatch = 1000

// handoff signals the hand-off loop that the ring changed.
type handoff struct {
	changed chan struct{} // cap 1: coalesces bursts of changes
	mu      *sync.Mutex   // serialises hand-offs
}

func newHandoff() handoff { return handoff{changed: make(chan struct{}, 1), mu: new(sync.Mutex)} }

// RingChanged tells the service that the ring changed, so that it hands
// off the counters it no longer owns. It never blocks: it is meant for
// cluster.Config.OnChange.
func (s *Service) RingChanged(_, _ *ring.Ring) {
	select {
	case s.handoff.changed <- struct{}{}:
	default:
	}
}

// run hands off after every ring change until ctx ends.
func (h handoff) run(ctx context.Context, s *Service) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.changed:
			s.HandOff(ctx)
		}
	}
}

// handOffTally is what one HandOff did, for its log line.
type handOffTally struct{ sent, refused, kept int }

// HandOff sends every counter this node holds but does not own under the
// current ring to its owner, and returns how many the owners took.
// Counters an owner refused, and those whose owner cannot be reached, stay
// here (the refused are counted in ringlimit_handoff_refused_total). A
// node shutting down calls it after leaving the cluster, when it owns
// nothing.
func (s *Service) HandOff(ctx context.Context) int {
	// One hand-off at a time: the one at shutdown must not find nothing to
	// do because the loop's is still in flight with the counters.
	s.handoff.mu.Lock()
	defer s.handoff.mu.Unlock()
	r := s.cluster.Ring()
	self := s.cluster.LocalMember().Name
	start := time.Now()
	var tally handOffTally
	batches := map[string][]limiter.Counter{}
	failed := false
	// One pass over the store; a failure stops it, and what it has not
	// reached stays for the next ring change.
	for c := range s.store.Extract(func(key string) bool {
		owner, ok := r.Owner(key)
		return ok && owner.Name != self
	}) {
		owner, _ := r.Owner(c.Key)
		batch := append(batches[owner.Name], c)
		if len(batch) < handOffBatch {
			batches[owner.Name] = batch
			continue
		}
		delete(batches, owner.Name)
		if !s.sendHandOff(ctx, owner, batch, &tally) || ctx.Err() != nil {
			failed = true
			break
		}
	}
	for _, batch := range batches {
		owner, _ := r.Owner(batch[0].Key)
		if failed || ctx.Err() != nil {
			s.store.Restore(batch)
			tally.kept += len(batch)
			continue
		}
		failed = !s.sendHandOff(ctx, owner, batch, &tally)
	}
	if tally != (handOffTally{}) {
		s.log.Info("handed off counters", "sent", tally.sent, "refused", tally.refused, "kept", tally.kept, "took", time.Since(start))
	}
	return tally.sent
}

// sendHandOff sends cs to owner and puts back into the store whatever
// owner did not take. It reports false if owner could not be asked.
func (s *Service) sendHandOff(ctx context.Context, owner ring.Member, cs []limiter.Counter, tally *handOffTally) bool {
	self := s.cluster.LocalMember().Name
	states := make([]*pb.CounterState, len(cs))
	for i := range cs {
		// The store's counters were made by valid checks, so they encode;
		// an empty record would come back refused, and be kept.
		b, _ := cs[i].AppendBinary(nil)
		states[i] = &pb.CounterState{Counter: b}
	}
	refusals, err := s.peers.HandOff(ctx, owner.PeerAddr, self, states)
	if err != nil {
		s.log.Warn("hand-off failed; keeping the counters", "owner", owner.Name, "counters", len(cs), "err", err)
		s.store.Restore(cs)
		tally.kept += len(cs)
		return false
	}
	if len(refusals) > 0 {
		kept := make([]limiter.Counter, len(refusals))
		reasons := map[string]int{}
		for i, r := range refusals {
			kept[i] = cs[r.GetIndex()] // peer.Pool checked the indexes
			reason := refusedLabel(r.GetReason())
			reasons[reason]++
			s.metrics.handOffRefused.WithLabelValues("sent", reason).Inc()
		}
		s.store.Restore(kept)
		s.log.Warn("hand-off: the new owner refused counters; keeping them", "owner", owner.Name,
			"refused", len(refusals), "of", len(cs), "reasons", reasons, "first", refusals[0].GetDetail())
		tally.refused += len(refusals)
	}
	accepted := len(cs) - len(refusals)
	tally.sent += accepted
	s.metrics.handedOff.WithLabelValues("sent").Add(float64(accepted))
	return true
}

// refusedLabel is a refusal reason as a metric label, e.g. "invalid".
func refusedLabel(r pb.Refusal_Reason) string { return strings.ToLower(r.String()) }
