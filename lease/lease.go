// Package lease serves lessees: processes outside the cluster that decide
// checks themselves from grants the keys' owners lend them, and report
// what they admitted every round (see docs/leases.md). It is the node's
// side of their protocol, between the public face (RateLimiter/Lease) and
// the owners' lending core (package global's Node.Lend).
//
// A lessee's call carries a report for each key it leases. Node checks
// the call and each report as strictly as a check, names the lessee's
// account by a hash of its secret (global.LesseeOf), and takes each report
// to its key's owner: this node's lending core for the keys it owns, the
// owner over the peer port (Peer/Lease) for the others, relayed once; the
// owner that receives a relayed report takes it only for a key it owns in
// its own ring. Answers come back in the order of the reports. A report
// that could not be taken gets its own error, and the others are
// answered.
package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/global"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// MaxReports is the most reports one call carries: as many as a check
// request carries items (checks.MaxItems), which the public port's
// codec stops decoding after, and which a relay carries at most.
const MaxReports = checks.MaxItems

// MaxIntervalMs bounds a report's interval_ms: a minute. The owner counts
// at most half the time-to-live of it anyway.
const MaxIntervalMs = 60_000

// SecretLen is the length of a lessee's secret, in bytes: 128 random bits.
const SecretLen = 16

// ErrInvalid is wrapped by the errors of a call refused whole: a secret
// that is not SecretLen bytes, or more than MaxReports reports.
var ErrInvalid = fmt.Errorf("invalid lease request: %w", checks.ErrInvalid)

// Lender is the owners' lending core: *global.Node.
type Lender interface {
	Lend(lessee global.Lessee, reports []global.LeaseReport) []global.LeaseGrant
}

// Membership is what Node needs of the cluster: the ring it routes by,
// and which member this node is.
type Membership interface {
	Ring() *ring.Ring
	LocalMember() ring.Member
}

// Peers relays reports to their keys' owner: package peer's Pool.
type Peers interface {
	Lease(ctx context.Context, addr, from string, lessee []byte, reports []*pb.LeaseReport) ([]*pb.LeaseGrant, error)
}

// Config configures a Node. Lender, Cluster and Result are
// required; Peers is needed once the cluster has other members.
type Config struct {
	Lender  Lender
	Cluster Membership
	Peers   Peers
	// MaxClockSkew bounds a report's created_at_ms, as --max-clock-skew
	// bounds a check's (see checks.Request).
	MaxClockSkew time.Duration
	// Result makes res the public result of decision d of r (the answer
	// to the hits a report asks to decide), as the service answers a check.
	Result func(res *pb.CheckResult, r *limiter.Request, d algorithms.Decision)
	// Await, if not nil, returns once the counter of key is on this node,
	// as far as it can tell: a key it has just come to own may wait for
	// its previous owner's hand-off, so that no report is charged into an
	// empty counter that the hand-off then merges with (keeping the more
	// charged of the two, not their sum). Service passes
	// handoff.Node.Await.
	Await func(ctx context.Context, key string)
	// Now is the server clock; nil means time.Now.
	Now func() time.Time
	// Logger receives warnings of failed relays; nil discards them.
	Logger *slog.Logger
}

// Node is one node's side of the lessee protocol. It is safe for
// concurrent use, and starts nothing.
type Node struct {
	conf Config
}

// New returns a Node.
func New(conf Config) *Node {
	if conf.Now == nil {
		conf.Now = time.Now
	}
	if conf.Logger == nil {
		conf.Logger = slog.New(slog.DiscardHandler)
	}
	return &Node{conf: conf}
}

// Lease answers a lessee's call: one grant per report, in order. It
// returns an error wrapping ErrInvalid, and answers nothing, for a secret
// that is not SecretLen bytes or more than MaxReports reports.
func (n *Node) Lease(ctx context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	secret, reports := req.GetLessee(), req.GetReports()
	switch {
	case len(secret) != SecretLen:
		return nil, fmt.Errorf("lessee: must be a secret of %d bytes, got %d: %w", SecretLen, len(secret), ErrInvalid)
	case len(reports) > MaxReports:
		return nil, fmt.Errorf("reports: more than %d: %w", MaxReports, ErrInvalid)
	}
	lessee := global.LesseeOf(secret)
	c := n.prepare(reports)
	r := n.conf.Cluster.Ring()
	self := n.conf.Cluster.LocalMember().Name
	byOwner := map[string][]int{} // positions in reports, by owner
	var owners []ring.Member
	for i := range reports {
		if c.grants[i] != nil {
			continue
		}
		owner, ok := r.Owner(reports[i].GetItem().GetKey())
		if !ok {
			owner = n.conf.Cluster.LocalMember() // an empty ring: this node owns every key
		}
		if _, seen := byOwner[owner.Name]; !seen {
			owners = append(owners, owner)
		}
		byOwner[owner.Name] = append(byOwner[owner.Name], i)
	}
	var wg sync.WaitGroup
	for _, owner := range owners {
		at := byOwner[owner.Name]
		if owner.Name == self {
			n.lend(ctx, c, lessee, at)
			continue
		}
		wg.Go(func() { n.relay(ctx, c, owner, lessee, reports, at) })
	}
	wg.Wait()
	return &pb.LeaseResponse{Grants: c.grants}, nil
}

// Relayed answers reports that node from relayed for lessee's account
// (Peer/Lease): as their owner, for the keys this node owns in its ring,
// never relaying them again. It returns an error wrapping ErrInvalid for
// an account id that is not 16 bytes or more than MaxReports reports.
func (n *Node) Relayed(ctx context.Context, from string, lessee []byte, reports []*pb.LeaseReport) ([]*pb.LeaseGrant, error) {
	switch {
	case len(lessee) != len(global.Lessee{}):
		return nil, fmt.Errorf("lessee: an account id of %d bytes, want %d: %w", len(lessee), len(global.Lessee{}), ErrInvalid)
	case len(reports) > MaxReports:
		return nil, fmt.Errorf("reports: more than %d: %w", MaxReports, ErrInvalid)
	}
	c := n.prepare(reports)
	var at []int
	for i := range reports {
		if c.grants[i] == nil {
			at = append(at, i)
		}
	}
	n.lend(ctx, c, global.Lessee(lessee), at)
	return c.grants, nil
}

// call is one call's reports in progress: those that passed validation in
// the core's form, and the answers.
type call struct {
	reqs   []global.LeaseReport // reqs[i] is reports[i]'s, if it passed
	grants []*pb.LeaseGrant     // answers; a report refused already has its own
}

// prepare validates reports: each item as a check's, its totals by the
// core when it takes it, and no key twice.
func (n *Node) prepare(reports []*pb.LeaseReport) *call {
	now := n.conf.Now()
	c := &call{reqs: make([]global.LeaseReport, len(reports)), grants: make([]*pb.LeaseGrant, len(reports))}
	type id struct{ name, key string }
	seen := make(map[id]bool, len(reports))
	for i, rep := range reports {
		r, err := n.request(rep, now)
		if err == nil {
			k := id{r.Name, r.Key}
			if seen[k] {
				err = errors.New("item: the same name and key as an earlier report")
			}
			seen[k] = true
		}
		if err != nil {
			c.grants[i] = refused(pb.ErrorCode_INVALID_ARGUMENT, err)
			continue
		}
		c.reqs[i] = global.LeaseReport{Request: r, Epoch: rep.GetEpoch(), Admitted: rep.GetAdmitted(), Acked: rep.GetAcked(),
			Asked: rep.GetAsked(), Granted: rep.GetGranted(), Release: rep.GetRelease(), Interval: time.Duration(rep.GetIntervalMs()) * time.Millisecond,
			Share: rep.GetShare(), ShareRateMilli: rep.GetShareRateMilli(), ShareBurst: rep.GetShareBurst()}
	}
	return c
}

// request validates rep's item as a GLOBAL check's, and returns it in the
// store's form, with the hits rep asks to decide.
func (n *Node) request(rep *pb.LeaseReport, now time.Time) (limiter.Request, error) {
	item := rep.GetItem()
	switch {
	case item == nil:
		return limiter.Request{}, errors.New("item: missing")
	case item.GetPolicy() != "":
		return limiter.Request{}, errors.New("item.policy: not in a lease report: name the limit")
	case item.GetMinIntervalMs() != 0:
		return limiter.Request{}, errors.New("item.min_interval_ms: not with a lease (as not with GLOBAL)")
	case item.GetCeiling() != 0 || item.GetParent() != nil:
		return limiter.Request{}, errors.New("item.ceiling: not with a lease (as not with GLOBAL)")
	case item.GetChargeRefused():
		return limiter.Request{}, errors.New("item.charge_refused: not with a lease (as not with GLOBAL)")
	case item.GetReset_():
		return limiter.Request{}, errors.New("item.reset: not in a lease report")
	case rep.GetHits() < 0:
		return limiter.Request{}, fmt.Errorf("hits: must not be negative, got %d", rep.GetHits())
	case rep.GetIntervalMs() < 0 || rep.GetIntervalMs() > MaxIntervalMs:
		return limiter.Request{}, fmt.Errorf("interval_ms: must be between 0 and %d, got %d", MaxIntervalMs, rep.GetIntervalMs())
	}
	r, err := checks.Request(item, now, n.conf.MaxClockSkew)
	if err != nil {
		return r, fmt.Errorf("item: %w", err)
	}
	if r.Algorithm == limiter.Spacing {
		return r, errors.New("item.limit: a lease needs a limit and a duration")
	}
	r.Hits = rep.GetHits()
	return r, nil
}

// lend has this node's core take c's reports at positions at, as their
// owner, once their counters are here (Config.Await).
func (n *Node) lend(ctx context.Context, c *call, lessee global.Lessee, at []int) {
	if len(at) == 0 {
		return
	}
	reqs := make([]global.LeaseReport, len(at))
	for k, i := range at {
		reqs[k] = c.reqs[i]
		if n.conf.Await != nil {
			n.conf.Await(ctx, reqs[k].Request.Key)
		}
	}
	for k, g := range n.conf.Lender.Lend(lessee, reqs) {
		c.grants[at[k]] = n.grant(&reqs[k].Request, g)
	}
}

// relay sends reports at positions at to owner and puts its answers in c;
// a relay that fails answers each of them UNAVAILABLE.
func (n *Node) relay(ctx context.Context, c *call, owner ring.Member, lessee global.Lessee, reports []*pb.LeaseReport, at []int) {
	out := make([]*pb.LeaseReport, len(at))
	for k, i := range at {
		out[k] = reports[i]
	}
	grants, err := n.conf.Peers.Lease(ctx, owner.PeerAddr, n.conf.Cluster.LocalMember().Name, lessee[:], out)
	if err == nil && len(grants) != len(at) {
		err = fmt.Errorf("owner %s answered %d of %d reports", owner.Name, len(grants), len(at))
	}
	for k, i := range at {
		switch {
		case err != nil:
			c.grants[i] = refused(pb.ErrorCode_UNAVAILABLE, fmt.Errorf("owner %s: %w", owner.Name, err))
		case grants[k] == nil:
			c.grants[i] = refused(pb.ErrorCode_INTERNAL, fmt.Errorf("owner %s answered a report with nothing", owner.Name))
		default:
			c.grants[i] = grants[k]
		}
	}
	if err != nil {
		n.conf.Logger.Warn("lease reports not relayed", "owner", owner.Name, "reports", len(at), "err", err)
	}
}

// grant is the public form of the core's answer g to the report of r.
func (n *Node) grant(r *limiter.Request, g global.LeaseGrant) *pb.LeaseGrant {
	switch {
	case errors.Is(g.Err, global.ErrInvalidReport):
		return refused(pb.ErrorCode_INVALID_ARGUMENT, g.Err)
	case errors.Is(g.Err, global.ErrNotOwner), errors.Is(g.Err, global.ErrLeaseBound):
		return refused(pb.ErrorCode_UNAVAILABLE, g.Err)
	case g.Err != nil:
		return refused(pb.ErrorCode_INTERNAL, g.Err)
	}
	out := &pb.LeaseGrant{Epoch: g.Epoch, Granted: g.Granted, Acked: g.Acked, TtlMs: g.TTL.Milliseconds(), State: &pb.CheckResult{},
		ShareRateMilli: g.ShareRateMilli, ShareBurst: g.ShareBurst}
	peek := *r
	peek.Hits = 0
	n.conf.Result(out.State, &peek, algorithms.Decision{Allowed: true, Remaining: g.Remaining, ResetAfter: g.ResetAfter, RetryAfter: g.RetryAfter})
	if g.Decided {
		out.Decided = &pb.CheckResult{}
		n.conf.Result(out.Decided, r, g.Decision)
	}
	return out
}

// refused is the answer to a report not taken, because of err.
func refused(code pb.ErrorCode, err error) *pb.LeaseGrant {
	return &pb.LeaseGrant{Error: err.Error(), ErrorCode: code}
}
