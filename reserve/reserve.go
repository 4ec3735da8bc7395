// Package reserve settles reservations (CheckItem.reserve_ttl_ms,
// Settle), which the store of the key's owner holds beside the counter
// (see limiter.Store.Reserve): a settle is carried out there, or relayed
// to the key's owner as this node's ring places it (the Go client sends
// it there itself). Reservations travel with their counter (see
// limiter/travel.go): a settle at a key's new owner, after a hand-off, or
// at its heir, once the ring has dropped an owner that died, finds the
// reservation there, since the settle first waits for the counter as a
// check would (a hand-off on its way, a replica to promote).
package reserve

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/clients"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// expireEvery is how often Run drops expired reservations.
const expireEvery = time.Second

// Custody is what settling needs of where counters are: *custody.Custody.
type Custody interface {
	// Ring is the ring this node routes by.
	Ring() *ring.Ring
	// Await returns once the key's counter is here, as a check's would be
	// (a replica promoted, a hand-off on its way awaited).
	Await(ctx context.Context, key string)
	// ExpireReservations drops the expired reservations of this node's
	// counters and of its replicas.
	ExpireReservations(now time.Time)
}

// Membership is what settling needs of the cluster: which member this
// node is.
type Membership interface{ LocalMember() ring.Member }

// Peers relays a settle to the key's owner: package peer's Pool.
type Peers interface {
	Settle(ctx context.Context, addr, from string, req *pb.SettleRequest) (*pb.SettleResponse, error)
}

// Config configures a Node; every field is required, but Peers on a node
// alone.
type Config struct {
	Store   *limiter.Store
	Custody Custody
	Cluster Membership
	Peers   Peers
	// Now is the clock settles are made at.
	Now func() time.Time
	// Result makes a check's result of a counter's decision (the state a
	// settle answers with).
	Result func(res *pb.CheckResult, r *limiter.Request, d algorithms.Decision)
	// Clients, if not nil, bounds the reservations each client makes
	// through this node (see Claims); nil bounds none.
	Clients ClientReservations
}

// Node settles the reservations of the keys this node owns, and relays
// the others' settles to their owners. It is safe for concurrent use.
type Node struct {
	store   *limiter.Store
	custody Custody
	cluster Membership
	peers   Peers
	now     func() time.Time
	result  func(res *pb.CheckResult, r *limiter.Request, d algorithms.Decision)
	clients ClientReservations
}

// New returns a Node. It starts nothing.
func New(conf Config) *Node {
	return &Node{store: conf.Store, custody: conf.Custody, cluster: conf.Cluster, peers: conf.Peers, now: conf.Now, result: conf.Result,
		clients: conf.Clients}
}

// Settle charges a reservation its real cost, or releases it (see
// limiter.Store.Settle), at the key's owner: here, or relayed to it over
// the peer port. An invalid request's error wraps checks.ErrInvalid and
// names the field; the owner's errors keep their kinds (see relayed); an
// owner out of reach is checks.ErrUnavailable, and the settle may be sent
// again: a retry charges once.
func (n *Node) Settle(ctx context.Context, req *pb.SettleRequest) (*pb.SettleResponse, error) {
	st, err := checks.Settlement(req, n.now())
	if err != nil {
		return nil, err
	}
	self := n.cluster.LocalMember()
	owner, ok := n.custody.Ring().Owner(st.Key)
	if !ok || owner.Name == self.Name {
		return n.settleHere(ctx, &st)
	}
	resp, err := n.peers.Settle(ctx, owner.PeerAddr, self.Name, req)
	if err != nil {
		return nil, relayedError(owner.Name, err)
	}
	return resp, nil
}

// Settled settles a reservation whose settle another node relayed here
// (see Settle), on this node's own reservations: it is validated as a
// client's, and never passed on, wherever the ring places its key.
func (n *Node) Settled(ctx context.Context, req *pb.SettleRequest) (*pb.SettleResponse, error) {
	st, err := checks.Settlement(req, n.now())
	if err != nil {
		return nil, err
	}
	return n.settleHere(ctx, &st)
}

// settleHere settles st on this node's store, once its counter is here as
// far as this node can tell, as a check's would be: the replicas of keys
// inherited from an owner that died are promoted, and a counter handed
// off to this node is waited for.
func (n *Node) settleHere(ctx context.Context, st *limiter.Settlement) (*pb.SettleResponse, error) {
	n.custody.Await(ctx, st.Key)
	out, err := n.store.Settle(st)
	if err != nil {
		return nil, err
	}
	state := &pb.CheckResult{}
	n.result(state, &limiter.Request{Limit: out.Limit, Now: st.Now}, out.Decision)
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

// Run drops expired reservations, of this node's own counters and of the
// replicas it keeps, every expireEvery until ctx ends, so that those in
// shards no reservation visits are counted and freed.
func (n *Node) Run(ctx context.Context) {
	t := time.NewTicker(expireEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n.custody.ExpireReservations(n.now())
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

// Claims are what one client's check claimed of Config.Clients.
type Claims struct {
	quota ClientReservations // nil: none to claim
	id    clients.ID
	now   time.Time
	at    []int // positions of the items that claimed
}

// Claims returns the claims of a client's check arriving with ctx.
func (n *Node) Claims(ctx context.Context) *Claims {
	return &Claims{quota: n.clients, id: clients.FromContext(ctx), now: n.now()}
}

// Admit is what a client's check of item i (as sent; resolved is it with
// its policy resolved) needs before it is decided: a time-to-live within
// the client's bound, which package service checks for one that names a
// policy, and a reservation's claim of its client's quota.
func (cl *Claims) Admit(i int, sent, resolved *pb.CheckItem) error {
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

// Done keeps the claim of each item that reserved until its reservation
// expires, and returns the others, once items have their results.
func (cl *Claims) Done(items []*pb.CheckItem, results []*pb.CheckResult) {
	for _, i := range cl.at {
		if r := results[i]; r != nil && r.GetReservationId() != "" {
			cl.quota.Keep(cl.id, cl.now.Add(checks.ReserveTTL(items[i])))
			continue
		}
		cl.quota.Return(cl.id)
	}
}
