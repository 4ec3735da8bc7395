package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// Settler takes settles of reservations: a node's RateLimiter/Settle, or,
// in a test, a *service.Service. A client made by Wrap of a Checker that
// is also a Settler settles with it.
type Settler interface {
	Settle(ctx context.Context, req *pb.SettleRequest) (*pb.SettleResponse, error)
}

// Errors of a settle, beside ErrInvalid and ErrUnavailable, wrapped with
// the server's text.
var (
	// ErrUnknownReservation: the key's owner does not hold the
	// reservation: past its time-to-live (it was charged in full), never
	// made, or lost with its counter (dropped as refilled, or beyond a
	// node's bound on reservations; one that moves with its counter, on
	// hand-off, to the heir of an owner that died, or through a snapshot,
	// is found there).
	ErrUnknownReservation = errors.New("unknown reservation")
	// ErrSettled: the reservation was settled before with another cost.
	ErrSettled = errors.New("reservation settled already")
)

// Reservation is hits of a Limit held for a key by Reserve, until Settle
// charges what was really spent or Release gives them all back. It is
// safe for concurrent use; only its first Settle or Release acts, and
// Release after a Settle does nothing, so that
//
//	r, err := c.Reserve(ctx, l, key, estimate, time.Minute)
//	...
//	defer r.Release(ctx)
//	cost := work()
//	r.Settle(ctx, cost)
//
// gives everything back when the work fails before it is settled.
type Reservation struct {
	// Decision is the reserve's: Allowed if the hits are held.
	Decision
	// ID names the reservation; empty if nothing is held.
	ID string

	name, key string
	settle    func(ctx context.Context, req *pb.SettleRequest) (*pb.SettleResponse, error)
	mu        sync.Mutex
	done      bool // settled or released
}

// Settled is the answer to a settle.
type Settled struct {
	// Decision is the counter's state after the settle (Allowed is true).
	Decision
	// GivenBack is the hits given back: those reserved beyond the cost, or
	// all on Release.
	GivenBack int64
	// Forced is the hits charged beyond the reservation (down to an empty
	// counter, no further).
	Forced int64
	// Replayed reports that the reservation was settled with the same cost
	// before (a retry) and nothing more was charged.
	Replayed bool
}

// Reserve holds hits of l for key for work whose cost is known only once
// it ends: it is admitted or refused as Take would be, and if admitted the
// hits count against l until the returned Reservation is settled or
// released, or, after ttl (1 ms to a day), are charged in full. A refused
// reservation (Allowed false) holds nothing. l may be neither Global nor
// leased, nor have a MinInterval or Ceiling. The key's owner holds the
// reservation: a client that routes settles there.
func (c *Client) Reserve(ctx context.Context, l Limit, key string, hits int64, ttl time.Duration) (*Reservation, error) {
	if c.settlers == nil {
		return nil, fmt.Errorf("reserve %s: %w: this client's checker takes no settles", l.Name, ErrInvalid)
	}
	if l.Lease {
		return nil, fmt.Errorf("reserve %s: %w: a leased limit is decided in this process and cannot reserve", l.Name, ErrInvalid)
	}
	item := l.Item(key, hits)
	ms := ceilMillis(ttl)
	item.ReserveTtlMs = &ms
	resp, err := c.checker.Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
	if err != nil {
		return nil, fmt.Errorf("reserve %s: %w", l.Name, err)
	}
	if n := len(resp.GetResponses()); n != 1 {
		return nil, fmt.Errorf("reserve %s: %w: %d results for 1 check", l.Name, ErrInternal, n)
	}
	res := resp.GetResponses()[0]
	d, err := DecisionOf(res)
	if err != nil {
		return nil, fmt.Errorf("reserve %s: %w", l.Name, err)
	}
	st := c.settlers(key)
	return &Reservation{Decision: d, ID: res.GetReservationId(), name: l.Name, key: key, settle: st.Settle}, nil
}

// Settle charges the reservation cost, the hits really spent: less than
// reserved gives the rest back at once, more charges the excess. A retry
// after an error answers as the first settle did, charging once.
func (r *Reservation) Settle(ctx context.Context, cost int64) (Settled, error) {
	return r.send(ctx, &cost)
}

// Release gives every reserved hit back. After a Settle, or on a refused
// reservation, it does nothing.
func (r *Reservation) Release(ctx context.Context) error {
	_, err := r.send(ctx, nil)
	return err
}

// send settles r with cost, or releases it if cost is nil.
func (r *Reservation) send(ctx context.Context, cost *int64) (Settled, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ID == "" || r.done && cost == nil {
		return Settled{}, nil
	}
	resp, err := r.settle(ctx, &pb.SettleRequest{ReservationId: r.ID, Name: r.name, Key: r.key, Cost: cost})
	if err != nil {
		return Settled{}, fmt.Errorf("settle %s: %w", r.name, settleError(err))
	}
	r.done = true
	d, err := DecisionOf(resp.GetState())
	if err != nil {
		return Settled{}, fmt.Errorf("settle %s: %w", r.name, err)
	}
	return Settled{Decision: d, GivenBack: resp.GetGivenBack(), Forced: resp.GetForced(), Replayed: resp.GetReplayed()}, nil
}

// settleError wraps err, a settle's, with the sentinel of its code.
func settleError(err error) error {
	sentinel := ErrInternal
	switch status.Code(err) {
	case codes.InvalidArgument:
		sentinel = ErrInvalid
	case codes.Unavailable:
		sentinel = ErrUnavailable
	case codes.NotFound:
		sentinel = ErrUnknownReservation
	case codes.FailedPrecondition:
		sentinel = ErrSettled
	}
	return fmt.Errorf("%w: %w", sentinel, err)
}
