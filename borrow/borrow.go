// Package borrow decides a check with a ceiling: it has its own limit, its
// guarantee, and may borrow beyond it, up to its ceiling, while its
// parent, a limit shared by every key that names it, has room. Three
// counters decide it, at the key's owner: its own (limiter.RoleLimit),
// its ceiling (limiter.RoleCeiling, of the same name, key and algorithm),
// and the parent, kept cluster-wide by package global (Borrow, Force).
// Hits the own and the ceiling counters both admit are guaranteed, and
// forced on the parent; otherwise they are borrowed if the ceiling admits
// them and the parent has room. The steps run one after another, never
// under a store lock (global locks its shard, then the store's), so a
// concurrent check may be refused, never admitted more. See
// docs/design-global.md, "Borrowing is two counters and a GLOBAL parent".
package borrow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// Store is what borrowing needs of the counter store: *limiter.Store.
type Store interface {
	TryAll(rs []limiter.Request, ds []algorithms.Decision) error
	DecideAll(rs []limiter.Request, ds []algorithms.Decision)
	Check(r *limiter.Request) algorithms.Decision
	Decide(r *limiter.Request) algorithms.Decision
}

// Parents is what borrowing needs of the parents, GLOBAL counters:
// *global.Node.
type Parents interface {
	// Force charges guaranteed hits to the parent, whether it has room or not.
	Force(r *limiter.Request, owner string)
	// Borrow decides borrowed hits from this node's grant or as the
	// parent's owner; forward says only the owner can.
	Borrow(r *limiter.Request, owner string) (d algorithms.Decision, forward bool)
}

// Owners is what borrowing needs to reach a parent's owner: *heal.Node.
type Owners interface {
	// Forward sends the parent's GLOBAL check to its owner and waits for
	// the answer, as any forward.
	Forward(ctx context.Context, owner ring.Member, req *pb.CheckRequest) (*pb.CheckResponse, error)
	// Unreachable is told of a parent's owner that could not be reached
	// (the check borrowed nothing).
	Unreachable(owner, msg string, err error)
}

// Config configures a Node. Store, Parents and Owners are required.
type Config struct {
	Store   Store
	Parents Parents
	Owners  Owners
	// Registerer receives ringlimit_borrow_checks_total; nil registers none.
	Registerer prometheus.Registerer
}

// Node decides the checks with a ceiling whose key this node owns. It is
// safe for concurrent use.
type Node struct {
	store    Store
	parents  Parents
	owners   Owners
	outcomes [numOutcomes]prometheus.Counter
}

// outcome is what became of a check with a ceiling beyond its guarantee:
// the label of ringlimit_borrow_checks_total.
type outcome uint8

const (
	outcomeAdmitted    outcome = iota // admitted by borrowing
	outcomeCeiling                    // refused: the key is at its ceiling
	outcomeParent                     // refused: the parent has no room
	outcomeUnreachable                // refused: the parent's owner could not be reached
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"borrowed", "ceiling", "parent_full", "parent_unreachable"}

// New returns a Node.
func New(conf Config) *Node {
	n := &Node{store: conf.Store, parents: conf.Parents, owners: conf.Owners}
	outcomes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringlimit_borrow_checks_total",
		Help: "Checks with a ceiling that went beyond their own limit, decided by this node as the key's owner, by outcome: borrowed (admitted from the parent's room), ceiling (refused: at the key's ceiling), parent_full (refused: the parent had no room), parent_unreachable (refused: the parent's owner could not be reached).",
	}, []string{"outcome"})
	if conf.Registerer != nil {
		conf.Registerer.MustRegister(outcomes)
	}
	for o := range n.outcomes {
		n.outcomes[o] = outcomes.WithLabelValues(outcomeNames[o])
	}
	return n
}

// Borrowing is how a check with a ceiling borrows (see above): its
// ceiling counter's request, and its parent's, as a request of the store
// and as the GLOBAL check the parent's owner decides.
type Borrowing struct {
	Ceiling    limiter.Request
	Parent     limiter.Request
	ParentItem *pb.CheckItem
}

// Of returns how r, the request of item, borrows, or nil if item has no
// ceiling. item has passed checks.Request.
func Of(item *pb.CheckItem, r *limiter.Request) *Borrowing {
	if item.Ceiling == 0 {
		return nil
	}
	b := &Borrowing{Ceiling: *r, Parent: *r}
	b.Ceiling.Role = limiter.RoleCeiling
	b.Ceiling.Limit = algorithms.Limit{Count: item.Ceiling, Period: r.Limit.Period}
	if r.Limit.Burst > item.Ceiling {
		b.Ceiling.Limit.Burst = r.Limit.Burst
	}
	p := item.GetParent()
	period := r.Limit.Period
	if p.DurationMs > 0 {
		period = time.Duration(p.DurationMs) * time.Millisecond
	}
	b.Parent = limiter.Request{Name: r.Name, Key: p.Key, Algorithm: r.Algorithm,
		Limit: algorithms.Limit{Count: p.Limit, Period: period}, Hits: r.Hits, Now: r.Now}
	b.ParentItem = &pb.CheckItem{Name: r.Name, Key: p.Key, Hits: &b.Parent.Hits, Limit: p.Limit,
		DurationMs: period.Milliseconds(), Algorithm: item.Algorithm, Behavior: pb.Behavior_GLOBAL,
		CreatedAtMs: item.CreatedAtMs}
	return b
}

// Decide decides r, which borrows as b says, at its key's owner (see
// above), the parent's owner being parentOwner, and reports whether its
// hits were admitted by borrowing. The decision's Remaining and
// ResetAfter are those of r's own counter, its guarantee; its Delay
// (LEAKY_BUCKET) that of the counter that admitted: the own, or the
// ceiling when borrowed. A check to be decided only on a counter held
// here (limiter.Request.Held) whose counter has left decides nothing, and
// its error wraps limiter.ErrNotHeld; the parent is not asked.
func (n *Node) Decide(ctx context.Context, r *limiter.Request, b *Borrowing, parentOwner ring.Member) (d algorithms.Decision, borrowed bool, err error) {
	own, ceiling := *r, b.Ceiling
	if r.Reset { // forget the own and the ceiling counter, not the parent
		pair := [2]limiter.Request{own, ceiling}
		pair[0].Hits, pair[1].Hits, pair[1].MinInterval = 0, 0, 0
		n.store.DecideAll(pair[:], make([]algorithms.Decision, 2))
		own.Reset, ceiling.Reset = false, false
	}
	pair := [2]limiter.Request{own, ceiling}
	pair[1].MinInterval = 0 // the spacing goes with the own counter
	var ds [2]algorithms.Decision
	if err := n.store.TryAll(pair[:], ds[:]); errors.Is(err, limiter.ErrNotHeld) {
		return ds[0], false, err // pulled, and its counter has left: decided nothing, the parent is not asked
	}
	d = ds[0]
	if d.Allowed {
		n.parents.Force(&b.Parent, parentOwner.Name)
		return d, false, nil
	}
	// Beyond the guarantee: borrow, with the spacing, if the ceiling and
	// then the parent have room.
	if peek := n.store.Check(&ceiling); !peek.Allowed {
		d.RetryAfter = algorithms.LongerWait(d.RetryAfter, peek.RetryAfter)
		n.outcomes[outcomeCeiling].Inc()
		return d, false, nil
	}
	p, reached := n.decideParent(ctx, b, parentOwner)
	if !p.Allowed {
		if reached {
			d.RetryAfter = algorithms.ShorterWait(d.RetryAfter, p.RetryAfter) // the guarantee's room, or the parent's
			n.outcomes[outcomeParent].Inc()
		} else {
			n.outcomes[outcomeUnreachable].Inc()
		}
		return d, false, nil
	}
	taken := n.store.Decide(&ceiling)
	if !taken.Allowed { // a concurrent check took the ceiling's room: the parent keeps the charge
		d.RetryAfter = algorithms.LongerWait(d.RetryAfter, taken.RetryAfter)
		n.outcomes[outcomeCeiling].Inc()
		return d, false, nil
	}
	d.Allowed, d.RetryAfter, d.Delay = true, 0, taken.Delay
	n.outcomes[outcomeAdmitted].Inc()
	return d, true, nil
}

// decideParent decides the borrowed hits of b's parent, whose owner is
// owner: from this node's grant, or as the owner (package global), or,
// when global says the owner must decide, by sending the owner the GLOBAL
// check of the parent at once. It reports whether the parent was decided;
// if its owner could not be reached the check borrows nothing.
func (n *Node) decideParent(ctx context.Context, b *Borrowing, owner ring.Member) (d algorithms.Decision, reached bool) {
	d, forward := n.parents.Borrow(&b.Parent, owner.Name)
	if !forward {
		return d, true
	}
	resp, err := n.owners.Forward(ctx, owner, &pb.CheckRequest{Requests: []*pb.CheckItem{b.ParentItem}})
	if err == nil && (len(resp.GetResponses()) != 1 || resp.GetResponses()[0].GetError() != "") {
		err = fmt.Errorf("parent's owner answered %v", resp.GetResponses())
	}
	if err != nil {
		n.owners.Unreachable(owner.Name, "parent's owner unreachable: no borrowing", err)
		return algorithms.Decision{}, false
	}
	res := resp.GetResponses()[0]
	d = algorithms.Decision{Allowed: res.GetStatus() == pb.Status_UNDER_LIMIT, RetryAfter: algorithms.Never}
	if res.GetRetryAfterMs() >= 0 {
		d.RetryAfter = time.Duration(res.GetRetryAfterMs()) * time.Millisecond
	}
	return d, true
}
