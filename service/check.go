package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/borrow"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/custody"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// A check's way through this node, top-down: Check validates its items
// (prepare), looks each key's owner up once, and decides them in rounds
// (decide): each round takes the node's view (look), re-plans what failed
// (replanFailed, replan), asks package global about GLOBAL checks
// (askGlobal), plans a route for each check (plan, plan.go), and carries
// the routes out (carry): custody prepares the checks routed here, the
// store decides the ready ones (decideHere, decide.go), and the others are
// sent (send.go). What every check gets back is in result.go.

// Check decides every item of req. It returns an error wrapping checks.ErrInvalid
// only for a request that is invalid as a whole (too many items); an
// invalid item gets its own error in its result and the others are
// answered.
func (s *Service) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	cl := s.reservations.Claims(ctx)
	c, err := s.prepare(req, cl.Admit)
	if err != nil {
		return nil, err
	}
	defer func() { cl.Done(c.items, c.results) }()
	c.began = s.custody.AwaitJoin(ctx) // a node that has not joined yet routes by the ring it joins
	c.ring = s.custody.Ring()
	ps := c.pendings()
	for j := range ps {
		ps[j].j = j
		ps[j].to, _ = c.ring.Owner(c.reqs[j].Key) // the owner, once; no owner (an empty ring): the zero Member, decided here
	}
	s.decide(ctx, c, ps)
	return &pb.CheckResponse{Responses: c.results}, nil
}

// prepare validates req's items, each also by admit (nil: none), which
// a client's check gives (see reserve.Claims).
func (s *Service) prepare(req *pb.CheckRequest, admit func(i int, sent, resolved *pb.CheckItem) error) (*call, error) {
	items := req.GetRequests()
	if len(items) > checks.MaxItems {
		return nil, checks.ErrTooManyItems
	}
	c := newCall(items, req.GetAll())
	now := s.now()
	for i, item := range items {
		item, err := s.withPolicy(item)
		if item != items[i] { // resolved: forward the resolved item, leaving req as it was
			if &c.items[0] == &items[0] {
				c.items = slices.Clone(items)
			}
			c.items[i] = item
		}
		var r limiter.Request
		if err == nil {
			r, err = checks.Request(item, now, s.skew)
		}
		if err == nil && c.all && item.Ceiling != 0 {
			err = &checks.FieldError{Field: "ceiling", Reason: `not in an all-or-nothing request ("all": true): a check that borrows is decided in steps, apart from the others`}
		}
		if err == nil && c.all && item.ReserveTtlMs != nil {
			err = &checks.FieldError{Field: "reserve_ttl_ms", Reason: `not in an all-or-nothing request ("all": true): a reservation is held and settled on its own`}
		}
		if err == nil && admit != nil {
			err = admit(i, items[i], item)
		}
		if err != nil {
			c.results[i] = errorResult(err)
			s.metrics.invalid(err)
			continue
		}
		b := borrow.Of(item, &r)
		if b != nil && c.borrows == nil {
			c.borrows = make([]*borrow.Borrowing, len(c.reqs), cap(c.reqs))
		}
		if c.borrows != nil {
			c.borrows = append(c.borrows, b)
		}
		c.reqs = append(c.reqs, r)
		c.pos = append(c.pos, i)
	}
	return c, nil
}

// maxRounds bounds the rounds of a request's plan (see plan.go). A check
// is re-planned only when its send fails, and each failure moves it on
// along forward, forward again at its key's new owner (once), relay to the
// first member of its key's succession this node can reach (at most
// maxHops times, see failOver), and this node's share, which decides it
// here; a relay that is not a failover is relayed again at the new owner
// (once) before the share, and a pull that fails is decided here next. So
// no check takes more than 3+maxHops rounds; a check left pending after
// them would be a bug in replan, and is answered with an internal error,
// not dropped.
const maxRounds = 3 + maxHops

// errNoRoute is the error of a check still pending after maxRounds.
var errNoRoute = fmt.Errorf("no route after %d rounds", maxRounds)

// decide decides the checks ps of c, in rounds: each takes the view,
// re-plans what failed in the round before, plans, and carries the plan
// out (see plan.go). It returns once every check of ps has its result.
func (s *Service) decide(ctx context.Context, c *call, ps []pending) {
	var failedOver []int // checks that went to their heir, by index into c.reqs
	var escrowed []int   // strict mode: checks answered from a grant while their owner cannot be reached
	for range maxRounds {
		// The replicas of keys this node has just inherited (their owner
		// left the ring) become its counters first, so that none is
		// decided without them.
		s.custody.Promote(c.ring)
		v := s.look(ctx)
		failedOver = s.replanFailed(c, ps, &v, failedOver)
		s.askGlobal(ctx, c, ps, &v)
		escrowed = s.fromEscrow(c, ps, &v, escrowed)
		ps = s.carry(ctx, c, ps, plan(c, ps, &v), &v)
		if len(ps) == 0 {
			break
		}
	}
	for _, p := range ps {
		c.results[c.pos[p.j]] = errorResult(errNoRoute)
	}
	for _, j := range failedOver {
		r := c.results[c.pos[j]]
		if r.GetError() == "" && r.Metadata[MetadataDecidedBy] == "" { // a heir that could not be reached marked its fallback
			r.Metadata = map[string]string{MetadataDecidedBy: routeFailover}
		}
	}
	markEscrow(c, escrowed)
}

// look returns the node's view now (see view).
func (s *Service) look(ctx context.Context) view {
	return view{self: s.cluster.LocalMember(), ring: s.custody.Ring(), leaving: s.custody.Leaving(), gone: ctx.Err(),
		handOff: s.custody, store: s.custody, heirs: s.custody.Heirs(), suspect: s.heal.Suspect, strict: s.strict.On()}
}

// replanFailed re-plans the checks of ps whose send failed, those of one
// send together (see replan), counts and logs what their failures taught,
// and returns failedOver with the checks that go to their heir added.
func (s *Service) replanFailed(c *call, ps []pending, v *view, failedOver []int) []int {
	for k := range ps {
		f := ps[k].failed
		if f == nil {
			continue
		}
		var sent []*pending // the checks f's send carried
		for i := k; i < len(ps); i++ {
			if ps[i].failed == f {
				ps[i].failed = nil
				sent = append(sent, &ps[i])
			}
		}
		switch replan(c, sent, f, v) {
		case lessonFailover:
			if f.kind == routeForward { // a failover that goes on to the next member counts once
				s.metrics.failovers.Add(float64(len(sent)))
				s.heal.Unreachable(f.to.Name, "owner unreachable, failing over to the keys' heirs", f.err)
			}
			for _, p := range sent {
				failedOver = append(failedOver, p.j)
			}
		case lessonShare:
			s.heal.Unreachable(f.to.Name, "owner unreachable, deciding locally with this node's share", f.err)
			s.metrics.forwardErrors.Inc()
		}
	}
	return failedOver
}

// askGlobal asks package global about the GLOBAL checks of ps that plan
// may decide here, and puts its answers in v: those going as their
// owner's check, with the owner's name (this node's if it owns the key),
// and those to be decided here as the owner, which custody prepares first
// (strict mode may refuse them; a replica this node holds becomes their
// counter). Asking decides a check when global can (it charges a grant,
// or the owner's lease); when it cannot, the check goes to its owner.
func (s *Service) askGlobal(ctx context.Context, c *call, ps []pending, v *view) {
	for k := range ps {
		p := &ps[k]
		if c.behavior(p.j) != pb.Behavior_GLOBAL || (p.next != nextOwner && p.next != nextHere) {
			continue
		}
		if v.global == nil {
			v.global = make([]answer, len(ps))
		}
		owner := p.to.Name
		if p.next == nextHere || v.owns(p.to) {
			owner = v.self.Name
		}
		r := &c.reqs[p.j]
		if owner == v.self.Name && p.next != nextHere && v.leaving && !v.store.Holds(r) {
			// Leaving, and the counter handed over: not this node's to
			// decide as the owner any more, but the new owner's, on the
			// counter (this node's grant, if it has one, still spends).
			if m, ok := v.ring.Owner(r.Key); ok && m.Name != v.self.Name {
				p.to, owner = m, m.Name
			}
		}
		if owner == v.self.Name {
			ck := [1]custody.Check{{Req: r, Owned: true, Global: true, KeepFence: true, Landed: p.next == nextHere}}
			s.custody.Prepare(ctx, c.ring, c.began, c.all, ck[:])
			if ck[0].Verdict.Kind == custody.Refuse {
				p.next = nextEscrow
				continue
			}
		}
		d, forward := s.global.Decide(r, owner)
		v.global[k] = answer{d: d, decided: !forward}
	}
}

// carry carries out one round: the routes of ps, planned with v. It
// decides here the checks routed here, then sends the others, all at
// once, and records the answers. It returns the checks whose send failed,
// each with its failure, for the next round; ps is reused for them.
func (s *Service) carry(ctx context.Context, c *call, ps []pending, routes []route, v *view) []pending {
	var nHere, nShare int
	for _, r := range routes {
		switch r.kind {
		case routeLocal:
			nHere++
		case routeFallback:
			nShare++
		}
	}
	// One slice holds, in turn, the checks decided here (indexes into ps),
	// those decided with a share (into c.reqs) and those sent (into ps).
	all := make([]int, len(routes))
	here, share, sent := all[:0:nHere], all[nHere:nHere:nHere+nShare], all[nHere+nShare:nHere+nShare]
	for k, r := range routes {
		j := ps[k].j
		switch r.kind {
		case routeLocal:
			here = append(here, k)
		case routeGlobal:
			s.setResult(c, j, v.global[k].d, routeGlobal)
		case routeFallback:
			share = append(share, j)
		case routeEscrow:
			s.refuseEscrow(c, j)
		case routeGone:
			c.results[c.pos[j]] = goneResult(ctx)
		default:
			sent = append(sent, k)
		}
	}
	sent = append(sent, s.decideHere(ctx, c, ps, routes, here, v)...)
	s.decideFallback(ctx, c, share)
	sends := groupSends(c, ps, routes, sent)
	s.sendAll(ctx, sends)
	failed := false
	for _, sd := range sends {
		err, answered := sd.err, false
		if err == nil && len(sd.resp.GetResponses()) != len(sd.ks) {
			err, answered = errors.New("owner answered the wrong number of results"), true
		}
		if err != nil {
			f := &failure{kind: sd.kind, to: sd.to, retried: sd.retried, err: err, answered: answered}
			for _, k := range sd.ks {
				ps[k].failed = f
			}
			failed = true
			continue
		}
		// The owner decided, and counted, these checks; here they count
		// only as forwarded, so that summing decisions over a cluster
		// counts each check once.
		for i, k := range sd.ks {
			j := ps[k].j
			c.results[c.pos[j]] = sd.resp.Responses[i]
			s.metrics.forwarded(c.behavior(j))
		}
	}
	if !failed {
		return nil
	}
	next := ps[:0] // filtered in place: next never passes the check being read
	for _, p := range ps {
		if p.failed != nil {
			next = append(next, p)
		}
	}
	return next
}

// call is one request of checks in progress: the items that passed
// validation, in the store's form, and where their results go. Only the
// loop that decides it (Service.decide) reads and writes it; the
// goroutines that send its checks to other nodes read only their own
// requests (see send).
type call struct {
	ring *ring.Ring // the ring the checks' owners were looked up in
	// began is when its checks began to wait for this node to join
	// (handoff.Node.AwaitJoin), or zero: their waits for their counters
	// end by the same bound.
	began time.Time
	items []*pb.CheckItem
	all   bool
	// notHeld says a check of c, to be decided only on a counter held
	// here (onlyHeld), found none, and was not decided (limiter.ErrNotHeld).
	notHeld bool
	reqs    []limiter.Request
	pos     []int // pos[j] is the item index of reqs[j]
	// borrows[j] is how reqs[j] borrows beyond its limit (package
	// borrow), nil if it has no ceiling; borrows is nil when no request
	// has one.
	borrows []*borrow.Borrowing
	results []*pb.CheckResult
	// decided holds the results of the checks decided here, one place an
	// item, allocated at once rather than one by one.
	decided []pb.CheckResult
	// one holds the slices of a call of one item, so that the most common
	// call is one allocation rather than six.
	one struct {
		req     [1]limiter.Request
		pos     [1]int
		result  [1]*pb.CheckResult
		decided [1]pb.CheckResult
		pending [1]pending
		check   [1]custody.Check
	}
}

// newCall returns the call of items, its slices empty (reqs, pos) or of
// one place an item (results, decided).
func newCall(items []*pb.CheckItem, all bool) *call {
	c := &call{items: items, all: all}
	if len(items) == 1 {
		c.reqs, c.pos, c.results, c.decided = c.one.req[:0], c.one.pos[:0], c.one.result[:], c.one.decided[:]
		return c
	}
	c.reqs, c.pos = make([]limiter.Request, 0, len(items)), make([]int, 0, len(items))
	c.results, c.decided = make([]*pb.CheckResult, len(items)), make([]pb.CheckResult, len(items))
	return c
}

// onlyHeld makes every check of c, and the ceiling of each that borrows,
// decided only on a counter the store holds (limiter.Request.Held).
func (c *call) onlyHeld() {
	for j := range c.reqs {
		c.reqs[j].Held = true
		if b := c.borrowing(j); b != nil {
			b.Ceiling.Held = true
		}
	}
}

// custodyChecks returns n checks for custody to prepare, for c: of a call
// of one item, its own; else from s.checkPool, to be given back with
// putCustodyChecks.
func (s *Service) custodyChecks(c *call, n int) []custody.Check {
	if len(c.reqs) == 1 {
		return c.one.check[:n]
	}
	if p, ok := s.checkPool.Get().(*[]custody.Check); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]custody.Check, n, max(n, 64))
}

// putCustodyChecks gives back cks, from custodyChecks for c, cleared: a
// request of many items would otherwise allocate, and the collector scan,
// a slice of them each round.
func (s *Service) putCustodyChecks(c *call, cks []custody.Check) {
	if len(c.reqs) == 1 || cap(cks) > checks.MaxItems {
		return
	}
	clear(cks)
	p := new([]custody.Check)
	*p = cks[:0]
	s.checkPool.Put(p)
}

// pendings returns a pending check for each of c.reqs, zero.
func (c *call) pendings() []pending {
	if len(c.reqs) == 1 {
		return c.one.pending[:]
	}
	return make([]pending, len(c.reqs))
}

// borrowing returns how c.reqs[j] borrows, or nil.
func (c *call) borrowing(j int) *borrow.Borrowing {
	if c.borrows == nil {
		return nil
	}
	return c.borrows[j]
}

// behavior returns the behavior of c.reqs[j].
func (c *call) behavior(j int) pb.Behavior { return c.items[c.pos[j]].Behavior }
