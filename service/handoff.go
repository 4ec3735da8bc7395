package service

import (
	"context"
	"sync"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// Hand-off: when the ring changes, counters this node holds for keys it no
// longer owns go to their new owner, which merges them (the more charged
// state wins), so that scaling out or a rolling restart does not reset
// limits.

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

// HandOff sends every counter this node holds but does not own under the
// current ring to its owner, and returns how many were taken. Counters
// whose owner cannot be reached stay here. A node shutting down calls it
// after leaving the cluster, when it owns nothing.
func (s *Service) HandOff(ctx context.Context) int {
	// One hand-off at a time: the one at shutdown must not find nothing to
	// do because the loop's is still in flight with the counters.
	s.handoff.mu.Lock()
	defer s.handoff.mu.Unlock()
	r := s.cluster.Ring()
	self := s.cluster.LocalMember().Name
	start := time.Now()
	moved, kept := 0, 0
	for ctx.Err() == nil {
		batch := s.store.Extract(func(key string) bool {
			owner, ok := r.Owner(key)
			return ok && owner.Name != self
		}, handOffBatch)
		if len(batch) == 0 {
			break
		}
		byOwner := map[string][]limiter.Counter{}
		owners := map[string]ring.Member{}
		for _, c := range batch {
			owner, _ := r.Owner(c.Key)
			byOwner[owner.Name] = append(byOwner[owner.Name], c)
			owners[owner.Name] = owner
		}
		for name, cs := range byOwner {
			if _, err := s.peers.HandOff(ctx, owners[name].PeerAddr, self, toCounterStates(cs)); err != nil {
				s.log.Warn("hand-off failed; keeping the counters", "owner", name, "counters", len(cs), "err", err)
				s.restore(cs)
				kept += len(cs)
				continue
			}
			moved += len(cs)
			s.metrics.handedOff.WithLabelValues("sent").Add(float64(len(cs)))
		}
		if kept > 0 {
			break // an owner is unreachable: retry at the next ring change
		}
	}
	if moved+kept > 0 {
		s.log.Info("handed off counters", "sent", moved, "kept", kept, "took", time.Since(start))
	}
	return moved
}

// restore puts back counters that could not be handed off.
func (s *Service) restore(cs []limiter.Counter) {
	for _, c := range cs {
		if err := s.store.Merge(c); err != nil {
			s.log.Error("restoring a counter", "err", err)
		}
	}
}

func toCounterStates(cs []limiter.Counter) []*pb.CounterState {
	out := make([]*pb.CounterState, len(cs))
	for i, c := range cs {
		out[i] = &pb.CounterState{
			Name: c.Name, Key: c.Key, Algorithm: pb.Algorithm(c.Algorithm),
			Words: c.Words, Log: c.Log, FullAtNs: c.Full, LastNs: c.Last,
		}
	}
	return out
}
