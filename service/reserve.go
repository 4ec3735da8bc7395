package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/limiter"
)

// A reserving check (CheckItem.reserve_ttl_ms) is routed, forwarded and
// batched as any check of its key, and reserves where it is decided; one
// that would be decided on a fallback share (its owner out of reach) is
// refused instead, since no settle would ever reach the reservation.
// Settles are package reserve's.

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
	if errors.Is(err, limiter.ErrNotHeld) {
		c.notHeld = true // nothing decided (see setDecided)
		return
	}
	if err != nil { // --max-reservations (counted by the store); the rest checks.Request refused already
		c.results[i] = errorResult(err)
		return
	}
	s.setResult(c, j, d, route)
	if d.Allowed {
		c.results[i].ReservationId = id.String()
	}
}

// Settle charges a reservation its real cost, or releases it, at the key's
// owner (see reserve.Node.Settle).
func (s *Service) Settle(ctx context.Context, req *pb.SettleRequest) (*pb.SettleResponse, error) {
	return s.reservations.Settle(ctx, req)
}

// Settle settles a reservation whose settle node from relayed here (see
// reserve.Node.Settled).
func (o Owner) Settle(ctx context.Context, _ string, req *pb.SettleRequest) (*pb.SettleResponse, error) {
	return o.s.reservations.Settled(ctx, req)
}
