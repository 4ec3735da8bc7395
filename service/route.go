package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/ring"
)

// route says where a check was decided, for the checks metric and the
// response metadata.
type route uint8

const (
	routeLocal     route = iota // this node owns the key (or LOCAL behaviour)
	routeForwarded              // the owner decided
	routeGlobal                 // GLOBAL: from this node's grant, or by the owner
	routeFallback               // the owner was unreachable: this node's share of the limit
	numRoutes
)

var routeNames = [numRoutes]string{"local", "forwarded", "global", "fallback"}

func (r route) String() string { return routeNames[r] }

// MetadataDecidedBy is the result metadata key that says a check was not
// decided by its owner; its value is routeFallback.
const MetadataDecidedBy = "decided_by"

// remoteGroup is the checks of one call bound for one owner.
type remoteGroup struct {
	owner     ring.Member
	js        []int // indexes into call.reqs
	unbatched bool  // sent at once in an RPC of its own
}

// route splits c's valid requests into those decided here, GLOBAL ones,
// and those to forward to their owner.
func (s *Service) route(c *call) (local, global, remote []int) {
	r := s.cluster.Ring()
	self := s.cluster.LocalMember().Name
	for j := range c.reqs {
		switch c.items[c.pos[j]].Behavior {
		case pb.Behavior_LOCAL:
			local = append(local, j)
		case pb.Behavior_GLOBAL:
			global = append(global, j)
		default:
			if owner, ok := r.Owner(c.reqs[j].Key); !ok || owner.Name == self {
				local = append(local, j)
			} else {
				remote = append(remote, j)
			}
		}
	}
	return local, global, remote
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
	r := s.cluster.Ring()
	byOwner := make(map[string]*remoteGroup) // the batched group of each owner
	var groups []*remoteGroup
	for _, j := range js {
		owner, _ := r.Owner(c.reqs[j].Key)
		unbatched := c.items[c.pos[j]].Behavior == pb.Behavior_UNBATCHED
		g := byOwner[owner.Name]
		if g == nil || (unbatched && !c.all) {
			g = &remoteGroup{owner: owner, unbatched: unbatched}
			groups = append(groups, g)
			if !unbatched || c.all {
				byOwner[owner.Name] = g
			}
		}
		g.unbatched = g.unbatched && unbatched
		g.js = append(g.js, j)
	}
	return groups
}

// forward sends each group to its owner, concurrently, and records the
// owners' answers. A group whose owner cannot be reached is decided here
// with this node's share of each limit.
func (s *Service) forward(ctx context.Context, c *call, groups []*remoteGroup) {
	if len(groups) == 1 {
		s.forwardGroup(ctx, c, groups[0]) // the common case: no goroutine
		return
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() { s.forwardGroup(ctx, c, g) })
	}
	wg.Wait()
}

func (s *Service) forwardGroup(ctx context.Context, c *call, g *remoteGroup) {
	req := &pb.CheckRequest{All: c.all, Requests: make([]*pb.CheckItem, len(g.js))}
	for k, j := range g.js {
		req.Requests[k] = c.items[c.pos[j]]
	}
	resp, err := s.send(ctx, g.owner, g.unbatched, req)
	if err != nil && !errors.Is(err, context.Canceled) {
		// The ring may have changed while the request was in flight: try
		// the key's new owner once.
		if owner, ok := s.cluster.Ring().Owner(c.reqs[g.js[0]].Key); ok && owner.Name != g.owner.Name {
			if owner.Name == s.cluster.LocalMember().Name {
				s.decideLocal(c, g.js, routeLocal)
				return
			}
			resp, err = s.send(ctx, owner, g.unbatched, req)
		}
	}
	if err == nil && len(resp.GetResponses()) != len(g.js) {
		err = errors.New("owner answered the wrong number of results")
	}
	if err != nil && ctx.Err() != nil {
		// The client has gone: charge nothing on its behalf.
		for _, j := range g.js {
			c.results[c.pos[j]] = errorResult(fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err()))
		}
		return
	}
	if err != nil {
		if s.logSampler.allow(g.owner.Name) {
			s.log.Warn("owner unreachable, deciding locally with this node's share (logged once a second per owner)",
				"owner", g.owner.Name, "err", err)
		}
		s.metrics.forwardErrors.Inc()
		s.decideFallback(c, g.js)
		return
	}
	for k, j := range g.js {
		i := c.pos[j]
		c.results[i] = resp.Responses[k]
		s.metrics.checked(c.reqs[j].Algorithm, c.items[i].Behavior, routeForwarded, resp.Responses[k].Status == pb.Status_UNDER_LIMIT)
	}
}

func (s *Service) send(ctx context.Context, owner ring.Member, unbatched bool, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	if unbatched {
		return s.peers.ForwardNow(ctx, owner.PeerAddr, req)
	}
	return s.peers.Forward(ctx, owner.PeerAddr, req)
}

// decideFallback decides c.reqs[js] on this node with its share of each
// limit (limit / members, at least 1), so that a cluster cut off from an
// owner admits about the limit in total rather than members times it.
func (s *Service) decideFallback(c *call, js []int) {
	members := int64(max(1, s.cluster.Ring().Len()))
	for _, j := range js {
		c.reqs[j].Limit = shareOf(c.reqs[j].Limit, members)
	}
	s.decideLocal(c, js, routeFallback)
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
