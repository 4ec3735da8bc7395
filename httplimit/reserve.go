package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/client"
)

// Costs known only afterwards. With ReserveTTL set, the middleware
// reserves Estimate(r) hits for the request (client.Client.Reserve),
// answered as a check of that many would be, runs the handler, and then
// settles the reservation with the cost the handler reported through
// ReportCost: less gives the rest back, more charges the excess. The
// RateLimit headers describe the counter after the reservation. The
// reservation is always settled, with the estimate if the handler
// reported nothing, panicked or lost its client (the settle is sent
// without the request's cancellation, within Timeout): work that started
// cost what was reserved for it, the safe side. A settle that fails goes
// to SettleError, and the reservation is charged in full when it expires.
// See docs/go.md, "httplimit".

// Reserver is what the middleware needs of ringlimit to reserve:
// *client.Client.
type Reserver interface {
	Reserve(ctx context.Context, l client.Limit, key string, hits int64, ttl time.Duration) (*client.Reservation, error)
}

// ErrNotReserver reports a Limiter with ReserveTTL whose Client cannot
// reserve.
var ErrNotReserver = errors.New("httplimit: ReserveTTL is set but Client is not a Reserver (*client.Client is)")

// costKey is the context key of a request's *cost.
type costKey struct{}

// cost is what a handler reported of its request's cost.
type cost struct {
	n        atomic.Int64
	reported atomic.Bool
}

// ReportCost records n, the real cost of the request whose context ctx
// is (or derives from), to settle its reservation with when the handler
// returns; a later report replaces an earlier one. It reports whether
// the request holds a reservation: false outside a Limiter with
// ReserveTTL, or for a request that is exempt, or served when ringlimit
// could not be asked, where n is dropped. A negative n is taken as 0.
func ReportCost(ctx context.Context, n int64) bool {
	c, ok := ctx.Value(costKey{}).(*cost)
	if !ok {
		return false
	}
	c.n.Store(max(n, 0))
	c.reported.Store(true)
	return true
}

// hits is the estimate of r's cost: Estimate's, or 1.
func (l *Limiter) hits(r *http.Request) int64 {
	if l.Estimate == nil {
		return 1
	}
	return l.Estimate(r)
}

// reserve holds hits of the limit for key, within Timeout.
func (l *Limiter) reserve(ctx context.Context, key string, hits int64) (*client.Reservation, error) {
	rs, ok := l.Client.(Reserver)
	if !ok {
		return nil, ErrNotReserver
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout())
	defer cancel()
	return rs.Reserve(ctx, l.Limit, key, hits, l.ReserveTTL)
}

// serveReserved runs next for r, whose reservation res holds estimate
// hits, then settles res with the cost next reported, or estimate; also
// when next panics, before the panic goes on.
func (l *Limiter) serveReserved(w http.ResponseWriter, r *http.Request, next http.Handler, res *client.Reservation, estimate int64) {
	c := &cost{}
	defer func() {
		n := estimate
		if c.reported.Load() {
			n = c.n.Load()
		}
		// Not cancelled with the request: a client that went away does
		// not undo the work done for it.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), l.timeout())
		defer cancel()
		if _, err := res.Settle(ctx, n); err != nil && l.SettleError != nil {
			l.SettleError(r, fmt.Errorf("settle %s of %d: %w", res.ID, n, err))
		}
	}()
	next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), costKey{}, c)))
}
