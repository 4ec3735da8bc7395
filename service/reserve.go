package service

import (
	"context"
	"fmt"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/limiter"
)

// Reservations (CheckItem.reserve_ttl_ms, Settle) are held by the store of
// the key's owner, beside the counter (see limiter.Store.Reserve). A
// reserving check is routed, forwarded and batched as any check of its
// key, and reserves where it is decided; one that would be decided on a
// fallback share (its owner out of reach) is refused instead, since no
// settle would ever reach the reservation. A settle must come to the
// key's owner: this build does not forward settles between nodes (the Go
// client sends each one to the owner itself), and reservations do not
// travel with hand-off, replicas or snapshots, so one whose counter moves
// is never settled and stays charged in full.

// expireEvery is how often Run drops expired reservations in shards no
// reservation visits, so that they are counted and freed.
const expireEvery = time.Second

// reserveTTL returns the time-to-live c.reqs[j] reserves its hits for, 0
// for a check that spends them.
func (c *call) reserveTTL(j int) time.Duration { return checks.ReserveTTL(c.items[c.pos[j]]) }

// reserve decides c.reqs[j], a reservation of ttl, on this node's store,
// decided by route, and records its result with the reservation's id.
func (s *Service) reserve(c *call, j int, ttl time.Duration, route routeKind) {
	i := c.pos[j]
	if route == routeFallback {
		c.results[i] = errorResult(fmt.Errorf("reserve_ttl_ms: the key's owner cannot be reached, and only it holds reservations: %w", checks.ErrUnavailable))
		return
	}
	d, id, err := s.store.Reserve(&c.reqs[j], ttl)
	if err != nil { // --max-reservations (counted by the store); the rest checks.Request refused already
		c.results[i] = errorResult(err)
		return
	}
	s.setResult(c, j, d, route)
	if d.Allowed {
		c.results[i].ReservationId = id.String()
	}
}

// Settle charges a reservation its real cost, or releases it (see
// limiter.Store.Settle). It answers only as the key's owner: on another
// node it fails with an error wrapping checks.ErrUnavailable that names
// the owner. An invalid request's error wraps checks.ErrInvalid and names
// the field.
func (s *Service) Settle(_ context.Context, req *pb.SettleRequest) (*pb.SettleResponse, error) {
	st, err := checks.Settlement(req, s.now())
	if err != nil {
		return nil, err
	}
	if owner, ok := s.ring().Owner(st.Key); ok && owner.Name != s.cluster.LocalMember().Name {
		return nil, fmt.Errorf("settle at the key's owner %s (%s), which holds its reservations: %w", owner.Name, owner.GRPCAddr, checks.ErrUnavailable)
	}
	out, err := s.store.Settle(&st)
	if err != nil {
		return nil, err
	}
	state := &pb.CheckResult{}
	decisionResult(state, &limiter.Request{Limit: out.Limit, Now: st.Now}, out.Decision)
	return &pb.SettleResponse{State: state, GivenBack: out.GivenBack, Forced: out.Forced, Replayed: out.Replayed}, nil
}

// expireReservations drops expired reservations every expireEvery until
// ctx ends.
func (s *Service) expireReservations(ctx context.Context) {
	t := time.NewTicker(expireEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.store.ExpireReservations(s.now())
		}
	}
}
