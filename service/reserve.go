package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/clients"
	"github.com/ringlimit/ringlimit/limiter"
)

// Reservations (CheckItem.reserve_ttl_ms, Settle) are held by the store of
// the key's owner, beside the counter (see limiter.Store.Reserve). A
// reserving check is routed, forwarded and batched as any check of its
// key, and reserves where it is decided; one that would be decided on a
// fallback share (its owner out of reach) is refused instead, since no
// settle would ever reach the reservation. A settle is relayed to the
// key's owner as this node's ring places it (the Go client sends it
// there itself). Reservations travel with their counter (see
// limiter/travel.go): a settle at a key's new owner, after a hand-off, or
// at its heir, once the ring has dropped an owner that died, finds the
// reservation there, since the settle first waits for the counter as a
// check would (a hand-off on its way, a replica to promote).

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

// Settle charges a reservation its real cost, or releases it (see
// limiter.Store.Settle), at the key's owner: here, or relayed to it over
// the peer port. An invalid request's error wraps checks.ErrInvalid and
// names the field; the owner's errors keep their kinds (see relayed); an
// owner out of reach is checks.ErrUnavailable, and the settle may be sent
// again: a retry charges once.
func (s *Service) Settle(ctx context.Context, req *pb.SettleRequest) (*pb.SettleResponse, error) {
	st, err := checks.Settlement(req, s.now())
	if err != nil {
		return nil, err
	}
	self := s.cluster.LocalMember()
	owner, ok := s.custody.Ring().Owner(st.Key)
	if !ok || owner.Name == self.Name {
		return s.settleHere(ctx, &st)
	}
	resp, err := s.peers.Settle(ctx, owner.PeerAddr, self.Name, req)
	if err != nil {
		return nil, relayedError(owner.Name, err)
	}
	return resp, nil
}

// Settle settles a reservation whose settle node from relayed here (see
// Service.Settle), on this node's own reservations: it is validated as a
// client's, and never passed on, wherever the ring places its key.
func (o Owner) Settle(ctx context.Context, _ string, req *pb.SettleRequest) (*pb.SettleResponse, error) {
	st, err := checks.Settlement(req, o.s.now())
	if err != nil {
		return nil, err
	}
	return o.s.settleHere(ctx, &st)
}

// settleHere settles st on this node's store, once its counter is here as
// far as this node can tell, as a check's would be: the replicas of keys
// inherited from an owner that died are promoted, and a counter handed
// off to this node is waited for.
func (s *Service) settleHere(ctx context.Context, st *limiter.Settlement) (*pb.SettleResponse, error) {
	s.custody.Await(ctx, st.Key)
	out, err := s.store.Settle(st)
	if err != nil {
		return nil, err
	}
	state := &pb.CheckResult{}
	decisionResult(state, &limiter.Request{Limit: out.Limit, Now: st.Now}, out.Decision)
	return &pb.SettleResponse{State: state, GivenBack: out.GivenBack, Forced: out.Forced, Replayed: out.Replayed}, nil
}

// relayed is the error the key's owner answered a relayed settle with:
// its message, and the kind its status code stands for, so that this
// node answers the client as the owner would have.
type relayed struct {
	msg  string
	kind error
}

func (e *relayed) Error() string { return e.msg }
func (e *relayed) Unwrap() error { return e.kind }

// relayedError returns the error of a settle relayed to owner that failed
// with err.
func relayedError(owner string, err error) error {
	st := status.New(codes.Unknown, err.Error())
	var answered interface{ GRPCStatus() *status.Status }
	if errors.As(err, &answered) { // the owner's own status, without the relay's wrapping
		st = answered.GRPCStatus()
	}
	var kind error
	switch st.Code() {
	case codes.NotFound:
		kind = limiter.ErrUnknownReservation
	case codes.FailedPrecondition:
		kind = limiter.ErrSettled
	case codes.InvalidArgument:
		kind = checks.ErrInvalid
	default: // out of reach, or failed there: the settle may be sent again
		return fmt.Errorf("settle at the key's owner %s: %w: %w", owner, checks.ErrUnavailable, err)
	}
	return &relayed{msg: st.Message(), kind: kind}
}

// expireReservations drops expired reservations, of this node's own
// counters and of the replicas it keeps, every expireEvery until ctx
// ends.
func (s *Service) expireReservations(ctx context.Context) {
	t := time.NewTicker(expireEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.custody.ExpireReservations(s.now())
		}
	}
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
