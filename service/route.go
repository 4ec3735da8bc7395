package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/ring"
)

// path is the part of a node that decides a check.
type path uint8

const (
	pathStore   path = iota // this node's counter store
	pathGlobal              // package global: a grant, or the lease of an owned counter
	pathForward             // the key's owner, another node
)

// pathOf is the one place that says which behaviour is decided where:
// LOCAL always here, GLOBAL by package global, the others by the owner.
func pathOf(b pb.Behavior, owned bool) path {
	switch {
	case b == pb.Behavior_LOCAL:
		return pathStore
	case b == pb.Behavior_GLOBAL:
		return pathGlobal
	case owned:
		return pathStore
	default:
		return pathForward
	}
}

// decide decides c.reqs[js], each by the part its behaviour and owner
// (c.owners) call for. The zero Member (a ring with no members) counts as
// this node.
//
// The replicas of keys this node has just inherited (their owner left the
// ring) become its counters first, so that none is decided without them.
func (s *Service) decide(ctx context.Context, c *call, js []int) {
	if !c.landed && s.leaving.Load() != nil {
		s.keepLeaving(c, js)
	}
	s.replica.Promote(c.ring)
	self := s.cluster.LocalMember().Name
	both := make([]int, 2*len(js)) // store and remote, in one allocation
	store, remote := both[:0:len(js)], both[len(js):len(js)]
	for _, j := range js {
		owner := c.owners[j].Name
		owned := owner == "" || owner == self
		switch pathOf(c.items[c.pos[j]].Behavior, owned) {
		case pathStore:
			store = append(store, j)
		case pathGlobal:
			if owned {
				owner = self
			}
			if c.landed {
				s.replica.PromoteKey(&c.reqs[j]) // relayed here as the key's heir: its owner cannot be reached (see failover)
			}
			d, forward := s.global.Decide(&c.reqs[j], owner)
			if forward {
				remote = append(remote, j)
				continue
			}
			s.setResult(c, j, d, routeGlobal)
		case pathForward:
			remote = append(remote, j)
		}
	}
	store, remote = s.pull(ctx, c, store, remote)
	// On a node that is leaving, which hands every counter off, counters
	// stay where they are (no hand-off round takes them out) from settle
	// until the checks that settle leaves here are decided, but for those
	// that borrow, which may wait on a parent's owner. Other nodes do not
	// wait for their rounds, which can take a forward deadline each when
	// an owner is unreachable: for them a check routed just before a
	// ring change may still find its counter on its way (see the README).
	release := func() {}
	if s.leaving.Load() != nil {
		release = s.handoff.Hold()
	}
	store, moved := s.settle(c, store)
	store, borrowing := splitBorrowing(c, store)
	s.decideLocal(ctx, c, store, routeLocal)
	release()
	s.decideLocal(ctx, c, borrowing, routeLocal)
	s.forward(ctx, c, s.groupByOwner(c, append(remote, moved...)))
}

// splitBorrowing splits c.reqs[js] into those without a ceiling and those
// with one, in place.
func splitBorrowing(c *call, js []int) (plain, borrowing []int) {
	if c.borrows == nil {
		return js, nil
	}
	plain = js[:0] // filtered in place: plain never passes the check being read
	for _, j := range js {
		if c.borrowing(j) != nil {
			borrowing = append(borrowing, j)
			continue
		}
		plain = append(plain, j)
	}
	return plain, borrowing
}

// keepLeaving makes c.reqs[js] go to this node's store, but LOCAL and
// GLOBAL checks, which go as ever: this node is leaving (Leave), and
// settle decides here those whose counter is still here, and relays the
// others to their new owners.
func (s *Service) keepLeaving(c *call, js []int) {
	self := s.cluster.LocalMember()
	for _, j := range js {
		if b := c.items[c.pos[j]].Behavior; b != pb.Behavior_LOCAL && b != pb.Behavior_GLOBAL {
			c.owners[j] = self
		}
	}
	c.recheck = true
}

// settle takes, out of c.reqs[store] (bound for this node's store), the
// checks whose counter is elsewhere, and makes them relays to the key's
// owner, which decides them where they land: the ring this node routes
// by now gives the key to another node, and this node holds no counter
// for it, because it handed it off (the check was routed by an older
// ring, or forwarded here by a node whose ring lags, or this node is
// leaving) or has never had it. Those whose counter is here are decided
// here: no other node has it yet, and the hand-off carries it on,
// charged. On a leaving node the caller holds handoff.Node.Hold from
// before settle until these are decided, so that no counter is on its way
// meanwhile: a hand-off takes it out of the store either before settle
// looks (then it is relayed to the owner, which has it) or after it is
// decided here.
//
// Only checks that may have moved are looked at again: those of a call
// marked recheck (forwarded here, or this node is leaving), or routed by
// a ring older than the current one. An all-or-nothing request stays
// whole for each key: its checks are decided here if every counter it
// would be decided on here is here, and relayed otherwise. Relayed and
// pulled checks are decided where they land, as ever.
func (s *Service) settle(c *call, store []int) (here, moved []int) {
	r := s.ring()
	if c.landed || len(store) == 0 || (!c.recheck && r == c.ring) {
		return store, nil
	}
	self := s.cluster.LocalMember().Name
	var owners []ring.Member // owners[k] is where store[k] goes; the zero Member: decided here. nil while all are.
	for k, j := range store {
		if c.items[c.pos[j]].Behavior == pb.Behavior_LOCAL {
			continue
		}
		if owner, ok := r.Owner(c.reqs[j].Key); ok && owner.Name != self && !s.store.Holds(&c.reqs[j]) {
			if owners == nil {
				owners = make([]ring.Member, len(store))
			}
			owners[k] = owner
		}
	}
	if owners == nil {
		return store, nil
	}
	here = store[:0] // filtered in place: here never passes the check being read
	for k, j := range store {
		owner := owners[k]
		if c.all && owner.Name == "" && c.items[c.pos[j]].Behavior != pb.Behavior_LOCAL {
			// A counter of the request is elsewhere: every check whose key
			// another node owns goes there, held here or not, so that the
			// key's checks are decided together.
			if o, ok := r.Owner(c.reqs[j].Key); ok && o.Name != self {
				owner = o
			}
		}
		if owner.Name == "" {
			here = append(here, j)
			continue
		}
		c.sendTo(j, owner, forwardRelay)
		moved = append(moved, j)
	}
	return here, moved
}

// pull deals with the checks of c.reqs[store] whose counter may still be
// with the key's previous owner, which this node waits for (see
// handoff.Node.Await). A check whose counter is not here yet is pulled:
// sent to that owner, which decides it if it still holds the counter (it
// has not seen the ring change yet: gossip can lag by seconds on a busy
// node), and otherwise answers that it does not, deciding nothing; then
// this node decides it (forwardGroup), waiting for the word that the
// hand-off is done. A check whose counter is here (it arrived, the word
// has not) waits for the word too, as do checks relayed or pulled here,
// which are never passed on. It returns the checks to decide here and the
// checks to forward.
func (s *Service) pull(ctx context.Context, c *call, store, remote []int) (here, forward []int) {
	here = store[:0] // filtered in place: here never passes the check being read
	for _, j := range store {
		if c.items[c.pos[j]].Behavior == pb.Behavior_LOCAL {
			here = append(here, j)
			continue
		}
		if !c.landed && !c.all {
			if from, ok := s.handoff.Pending(c.ring, c.reqs[j].Key); ok && !s.store.Holds(&c.reqs[j]) {
				c.sendTo(j, from, forwardPull)
				remote = append(remote, j)
				continue
			}
		}
		if c.landed {
			s.replica.PromoteKey(&c.reqs[j]) // relayed here as the key's heir: its owner cannot be reached (see failover)
		}
		s.handoff.Await(ctx, c.ring, c.reqs[j].Key) // its counter may be on its way here
		here = append(here, j)
	}
	return here, remote
}

// failover decides g's checks, whose owner cannot be reached, at each
// key's heir: the node that would own it without that owner, to which the
// owner replicates its counters (package replica). The heir takes its
// replica as its own counter and decides with the whole limit, so a
// crashed owner's keys go on from where its last replication left them,
// rather than from an empty counter with a share on every node. This node
// decides those it is the heir of; the others are relayed to their heir.
// A relay or pull that fails, or a heir that cannot be reached, falls back
// to shares as before. It reports whether it took the checks.
//
// GLOBAL checks fail over alike: the heir decides them on its replica less
// the hits the owner had lent to the nodes and they may still admit, which
// it knows from the owner's broadcasts (see package global).
//
// An owner that is only frozen (a GC pause, a stalled VM) keeps its own
// counter: what its heir admitted meanwhile stays with the heir until the
// next ring change hands it over, so a key can be over its limit by what
// the heir admitted while the owner was unreachable; the shares did as
// much.
func (s *Service) failover(ctx context.Context, c *call, g *remoteGroup) bool {
	if g.mode != forwardPlain || ctx.Err() != nil {
		return false
	}
	without := s.ringWithout(g.owner.Name)
	if without.Len() == 0 {
		return false
	}
	self := s.cluster.LocalMember().Name
	relayed := *c // the relays' own modes: other groups of c may be forwarding meanwhile
	relayed.modes = make([]forwardMode, len(c.reqs))
	var here, there []int
	for _, j := range g.js {
		heir, _ := without.Owner(c.reqs[j].Key)
		if heir.Name == self {
			here = append(here, j)
			continue
		}
		relayed.sendTo(j, heir, forwardRelay)
		there = append(there, j)
	}
	s.metrics.failovers.Add(float64(len(g.js)))
	s.decideLanded(ctx, c, here)
	s.forward(ctx, &relayed, s.groupByOwner(&relayed, there))
	for _, j := range g.js {
		r := c.results[c.pos[j]]
		if r.GetError() == "" && r.Metadata[MetadataDecidedBy] == "" { // a heir that could not be reached marked its fallback
			r.Metadata = map[string]string{MetadataDecidedBy: routeFailover}
		}
	}
	return true
}

// ringWithout returns the ring this node routes by without member name,
// built once per ring and member.
func (s *Service) ringWithout(name string) *ring.Ring { return s.without.Without(s.ring(), name) }

// decideLanded decides c.reqs[js] here, as their owner, through the same
// switch as any check (GLOBAL keeps its lease accounting), but landed:
// never passed on, nor pulled again. It decides on a copy of c, whose
// slices it shares, as other groups of c may be deciding meanwhile.
func (s *Service) decideLanded(ctx context.Context, c *call, js []int) {
	here := *c
	here.landed = true
	for _, j := range js {
		c.owners[j] = s.cluster.LocalMember()
	}
	s.decide(ctx, &here, js)
}

// remoteGroup is the checks of one call bound for one owner.
type remoteGroup struct {
	owner     ring.Member
	js        []int // indexes into call.reqs
	unbatched bool  // sent at once in an RPC of its own
	mode      forwardMode
	retried   bool // sent again after its first owner failed: not a third time
}

// groupByOwner groups c.reqs[js] into forwards: BATCHED checks bound for
// one owner share a group (the peer pool batches it further with other
// requests); an UNBATCHED check is a group of its own, one RPC. With c.all
// every check bound for one owner shares a group, sent at once if all are
// UNBATCHED: items with the same key have the same owner, so an
// all-or-nothing group is never split.
func (s *Service) groupByOwner(c *call, js []int) []*remoteGroup {
	if len(js) == 0 {
		return nil
	}
	// shared are the groups that checks join: the batched group of each
	// owner, and with c.all the relays and pulls to it. A cluster has few
	// owners, so they are searched in turn rather than kept in a map.
	var groups, shared []*remoteGroup
	for _, j := range js {
		owner, mode := c.owners[j], c.mode(j)
		unbatched := c.items[c.pos[j]].Behavior == pb.Behavior_UNBATCHED || mode != forwardPlain // relays and pulls are RPCs of their own
		var g *remoteGroup
		for _, sg := range shared {
			if sg.owner.Name == owner.Name && sg.mode == mode {
				g = sg
				break
			}
		}
		if g == nil || (unbatched && !c.all) {
			g = &remoteGroup{owner: owner, unbatched: unbatched, mode: mode}
			groups = append(groups, g)
			if !unbatched || c.all {
				shared = append(shared, g)
			}
		}
		g.unbatched = g.unbatched && unbatched
		g.js = append(g.js, j)
	}
	return groups
}

// forward sends each group to its owner and records the owners' answers.
// A group whose owner cannot be reached is decided here with this node's
// share of each limit. Batched groups are handed to their owners' batches
// all at once, and waited for here, one after another: no goroutine a
// group, which would cost more than most forwards. A group that goes in
// an RPC of its own (UNBATCHED, relayed, pulled) is sent from a goroutine
// of its own when there are others.
func (s *Service) forward(ctx context.Context, c *call, groups []*remoteGroup) {
	switch len(groups) {
	case 0:
		return
	case 1:
		s.forwardGroup(ctx, c, groups[0], nil) // the common case
		return
	}
	started := make([]*sending, len(groups))
	var wg sync.WaitGroup
	for i, g := range groups {
		if g.unbatched || g.mode != forwardPlain {
			wg.Go(func() { s.forwardGroup(ctx, c, g, nil) })
			continue
		}
		started[i] = s.start(ctx, g.owner, g.request(c))
	}
	for i, g := range groups {
		if started[i] != nil {
			s.forwardGroup(ctx, c, g, started[i])
		}
	}
	wg.Wait()
}

// request is the request of g's checks, as c's caller sent them.
func (g *remoteGroup) request(c *call) *pb.CheckRequest {
	req := &pb.CheckRequest{All: c.all, Requests: make([]*pb.CheckItem, len(g.js))}
	for k, j := range g.js {
		req.Requests[k] = c.items[c.pos[j]]
	}
	return req
}

// forwardGroup sends g to its owner, unless st is g on its way already,
// and records the answer, or decides g here when the owner cannot.
func (s *Service) forwardGroup(ctx context.Context, c *call, g *remoteGroup, st *sending) {
	var (
		req  *pb.CheckRequest
		resp *pb.CheckResponse
		err  error
	)
	if st != nil {
		req = st.req
		resp, err = s.finish(ctx, st)
	} else {
		req = g.request(c)
		resp, err = s.send(ctx, g.owner, g.unbatched, g.mode, req)
	}
	if g.mode == forwardPull && err != nil && ctx.Err() == nil {
		// The previous owner does not hold the counter (it has handed it
		// over, or never had it), or does not answer: decide here, as the
		// owner, waiting for the counter if it is on its way.
		s.decideLanded(ctx, c, g.js)
		return
	}
	if err != nil && !errors.Is(err, context.Canceled) && !g.retried {
		// The ring may have changed while the request was in flight: try
		// each key's new owner once, deciding here those this node owns
		// now. The group's keys shared the old owner, not always a new
		// one: a member that leaves spreads its keys over the others.
		if moved := s.regroup(c, g); moved != nil {
			self := s.cluster.LocalMember().Name
			for _, sub := range moved {
				if sub.owner.Name == self {
					s.decideLanded(ctx, c, sub.js)
					continue
				}
				s.forwardGroup(ctx, c, sub, nil)
			}
			return
		}
	}
	if err == nil && len(resp.GetResponses()) != len(g.js) {
		err = errors.New("owner answered the wrong number of results")
	}
	if err != nil && ctx.Err() != nil {
		// The client has gone: charge nothing on its behalf.
		for _, j := range g.js {
			c.results[c.pos[j]] = errorResult(fmt.Errorf("%w: %w", checks.ErrUnavailable, ctx.Err()))
		}
		return
	}
	if err != nil && s.failover(ctx, c, g) {
		return
	}
	if err != nil {
		if s.logSampler.allow(g.owner.Name) {
			s.log.Warn("owner unreachable, deciding locally with this node's share (logged once a second per owner)",
				"owner", g.owner.Name, "err", err)
		}
		s.metrics.forwardErrors.Inc()
		s.decideFallback(ctx, c, g.js)
		return
	}
	// The owner decided, and counted, these checks; here they count only
	// as forwarded, so that summing decisions over a cluster counts each
	// check once.
	for k, j := range g.js {
		i := c.pos[j]
		c.results[i] = resp.Responses[k]
		s.metrics.forwarded(c.items[i].Behavior)
	}
}

// regroup returns g's checks grouped by their keys' owners in the ring
// this node routes by now, each group marked retried, if that ring gives
// any of them an owner other than g's; nil otherwise. The checks of an
// all-or-nothing request that share a key share its owner, and so stay
// together.
func (s *Service) regroup(c *call, g *remoteGroup) []*remoteGroup {
	r := s.ring()
	var groups []*remoteGroup
	for _, j := range g.js {
		owner, ok := r.Owner(c.reqs[j].Key)
		if !ok {
			return nil // no member left to try
		}
		var sub *remoteGroup
		for _, sg := range groups {
			if sg.owner.Name == owner.Name {
				sub = sg
				break
			}
		}
		if sub == nil {
			sub = &remoteGroup{owner: owner, unbatched: g.unbatched, mode: g.mode, retried: true}
			groups = append(groups, sub)
		}
		sub.js = append(sub.js, j)
	}
	if len(groups) == 1 && groups[0].owner.Name == g.owner.Name {
		return nil
	}
	for _, sub := range groups {
		for _, j := range sub.js {
			c.owners[j] = sub.owner
		}
	}
	return groups
}

// sending is a batched forward on its way to its owner (see start).
type sending struct {
	req   *pb.CheckRequest
	f     peer.Forwarding // nil when err is set
	watch context.Context // ends when the owner becomes suspect
	addr  string
	err   error // errSuspect: not sent, the owner is suspect
}

// start hands req to the batch for owner, unless owner is suspect: then
// the forward fails at once with errSuspect rather than wait the forward
// deadline again.
func (s *Service) start(ctx context.Context, owner ring.Member, req *pb.CheckRequest) *sending {
	st := &sending{req: req, addr: owner.PeerAddr}
	st.watch = s.suspects.watch(owner.PeerAddr) // before asking: a suspicion from now on releases this forward
	if s.suspects.suspect(owner.PeerAddr, time.Now()) {
		st.err = errSuspect
		return st
	}
	st.f = s.peers.Start(ctx, owner.PeerAddr, req)
	return st
}

// finish waits for the answer to st. A forward that finds its owner
// unreachable makes it suspect, and so releases the other forwards in
// flight to it, which fail with errSuspect too.
func (s *Service) finish(ctx context.Context, st *sending) (*pb.CheckResponse, error) {
	if st.err != nil {
		return nil, st.err
	}
	resp, err := st.f.Wait(st.watch.Done())
	if err != nil && ctx.Err() == nil && st.watch.Err() != nil {
		return nil, errSuspect
	}
	if failed(ctx, err) {
		s.suspects.mark(st.addr, time.Now())
	}
	return resp, err
}

// send forwards req to owner, as start and finish do, in its RPC of its
// own when unbatched or in mode relay or pull.
func (s *Service) send(ctx context.Context, owner ring.Member, unbatched bool, mode forwardMode, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	if !unbatched && mode == forwardPlain {
		return s.finish(ctx, s.start(ctx, owner, req))
	}
	watch := s.suspects.watch(owner.PeerAddr) // before asking: a suspicion from now on releases this forward
	if s.suspects.suspect(owner.PeerAddr, time.Now()) {
		return nil, errSuspect
	}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(watch, func() { cancel(errSuspect) })()
	var resp *pb.CheckResponse
	var err error
	switch mode {
	case forwardPull:
		resp, err = s.peers.Pull(fctx, owner.PeerAddr, req)
		if errors.Is(err, peer.ErrNotHere) {
			return nil, err // an answer: the owner is not suspect
		}
	case forwardRelay:
		resp, err = s.peers.Relay(fctx, owner.PeerAddr, req)
	default:
		resp, err = s.peers.ForwardNow(fctx, owner.PeerAddr, req)
	}
	if err != nil && ctx.Err() == nil && context.Cause(fctx) == errSuspect {
		return nil, errSuspect
	}
	if failed(ctx, err) {
		s.suspects.mark(owner.PeerAddr, time.Now())
	}
	return resp, err
}

// decideFallback decides c.reqs[js] on this node with its share of each
// limit (limit / members, at least 1), so that a cluster cut off from an
// owner admits about the limit in total rather than members times it. The
// answer's limit is that share, so a caller can see it was not the whole.
// A spacing's share is its interval times members (see spacingShare). A
// check with a ceiling borrows nothing: its parent's owner may be as far
// out of reach as its own.
func (s *Service) decideFallback(ctx context.Context, c *call, js []int) {
	members := int64(max(1, s.cluster.Ring().Len()))
	for _, j := range js {
		if c.borrows != nil {
			c.borrows[j] = nil
		}
		r := &c.reqs[j]
		if r.Algorithm == limiter.Spacing {
			r.Limit = limiter.SpacingLimit(spacingShare(r.Limit.Period, members))
			continue
		}
		r.Limit = shareOf(r.Limit, members)
		r.MinInterval = spacingShare(r.MinInterval, members)
	}
	s.decideLocal(ctx, c, js, routeFallback)
	for _, j := range js {
		c.results[c.pos[j]].Metadata = map[string]string{MetadataDecidedBy: routeFallback.String()}
	}
}

// shareOf is one member's share of l: Count and Burst divided by members,
// rounded down but at least 1.
func shareOf(l algorithms.Limit, members int64) algorithms.Limit {
	l.Count = max(1, l.Count/members)
	if l.Burst > 0 {
		l.Burst = max(1, l.Burst/members)
	}
	return l
}

// spacingShare is one member's share of a spacing of interval d: members
// times d, so that members spacing apart admit about one request per d in
// all, as shares of a limit do (requests that reach two members may then
// come closer together than d: only the owner keeps the spacing exact).
// It is at most checks.MaxDuration, the longest interval a check may ask
// for, so that the counter it leaves is one a check could have made.
func spacingShare(d time.Duration, members int64) time.Duration {
	if d > checks.MaxDuration/time.Duration(members) {
		return checks.MaxDuration
	}
	return d * time.Duration(members)
}

// sampler lets through one event a second per key, so that a partition
// that fails every forward does not fill the log; metrics count them all.
type sampler struct {
	mu   sync.Mutex
	last map[string]time.Time
}

func (s *sampler) allow(key string) bool {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.last[key]) < time.Second {
		return false
	}
	if s.last == nil || len(s.last) > 1000 {
		s.last = make(map[string]time.Time) // keys are owners: few, but bounded anyway
	}
	s.last[key] = now
	return true
}
