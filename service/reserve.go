package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/clients"
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

// ClientReservations bounds the reservations one client makes through
// this node (see package clients): a client's check claims one for each
// item that would reserve, and then returns it or keeps it for as long
// as the reservation lives. package clients' Quota.
type ClientReservations interface {
	Claim(id clients.ID, now time.Time) bool
	Return(id clients.ID)
	Keep(id clients.ID, until time.Time)
	Max() int
}

// claims are what one client's check claimed of Config.Clients.
type claims struct {
	quota ClientReservations // nil: none to claim
	id    clients.ID
	now   time.Time
	at    []int // positions of the items that claimed
}

// claimsOf returns the claims of a client's check arriving with ctx.
func (s *Service) claimsOf(ctx context.Context) *claims {
	return &claims{quota: s.clients, id: clients.FromContext(ctx), now: s.now()}
}

// admit is what a client's check of item i (as sent; resolved is it with
// its policy resolved) needs before it is decided: a time-to-live within
// the client's bound, which withPolicy checks for one that names a
// policy, and a reservation's claim of its client's quota.
func (cl *claims) admit(i int, sent, resolved *pb.CheckItem) error {
	if checks.ReserveTTL(resolved) == 0 {
		return nil
	}
	if sent.GetPolicy() == "" {
		if err := checks.CheckClientReserveTTL(resolved, 0); err != nil {
			return err
		}
	}
	if cl.quota == nil {
		return nil
	}
	if !cl.quota.Claim(cl.id, cl.now) {
		return fmt.Errorf("%w: the client %s holds --max-reservations-per-client %d through this node, open or settled within their time-to-live",
			limiter.ErrTooManyReservations, cl.id, cl.quota.Max())
	}
	cl.at = append(cl.at, i)
	return nil
}

// done keeps the claim of each item that reserved until its reservation
// expires, and returns the others.
func (cl *claims) done(c *call) {
	for _, i := range cl.at {
		if r := c.results[i]; r != nil && r.GetReservationId() != "" {
			cl.quota.Keep(cl.id, cl.now.Add(checks.ReserveTTL(c.items[i])))
			continue
		}
		cl.quota.Return(cl.id)
	}
}
