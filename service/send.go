package service

import (
	"context"
	"sync"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/heal"
	"github.com/ringlimit/ringlimit/ring"
)

// A send is checks of one request that go to one node together: one
// forward, relay or pull. Only the goroutine that sends it writes resp
// and err, and only once it is done are they read.
type send struct {
	kind    routeKind
	to      ring.Member
	batched bool // handed to the node's batch (peer.Pool.Start); else an RPC of its own
	retried bool
	ks      []int // the checks it carries: indexes into the round's pending checks
	req     *pb.CheckRequest
	resp    *pb.CheckResponse
	err     error
}

// groupSends groups the checks ks of ps, routed to other nodes, into
// sends: BATCHED forwards bound for one node share a send (the peer pool
// batches it further with other requests); an UNBATCHED forward, a relay
// and a pull are sends of their own, one RPC each. With c.all every check
// bound for one node the same way shares a send, sent at once if all are
// UNBATCHED: items with the same key have the same owner, so an
// all-or-nothing group is never split.
func groupSends(c *call, ps []pending, routes []route, ks []int) []*send {
	if len(ks) == 0 {
		return nil
	}
	// shared are the sends that checks join: the batched send to each
	// node, and with c.all every send. A cluster has few nodes, so they
	// are searched in turn rather than kept in a map.
	var sends, shared []*send
	for _, k := range ks {
		r, p := routes[k], &ps[k]
		unbatched := c.behavior(p.j) == pb.Behavior_UNBATCHED || r.kind != routeForward
		var sd *send
		for _, sh := range shared {
			if sh.to.Name == r.to.Name && sh.kind == r.kind && sh.retried == p.retried {
				sd = sh
				break
			}
		}
		if sd == nil || (unbatched && !c.all) {
			sd = &send{kind: r.kind, to: *r.to, batched: !unbatched, retried: p.retried,
				req: &pb.CheckRequest{All: c.all}}
			sends = append(sends, sd)
			if !unbatched || c.all {
				shared = append(shared, sd)
			}
		}
		sd.batched = sd.batched || !unbatched
		sd.ks = append(sd.ks, k)
		sd.req.Requests = append(sd.req.Requests, c.items[c.pos[p.j]])
	}
	return sends
}

// sendAll sends each send to its node and records its answer in it.
// Batched sends are handed to their nodes' batches all at once, and
// waited for here, one after another: no goroutine a send, which would
// cost more than most forwards. A send that goes in an RPC of its own
// (UNBATCHED, relayed, pulled) is sent from a goroutine of its own when
// there are others.
func (s *Service) sendAll(ctx context.Context, sends []*send) {
	switch len(sends) {
	case 0:
		return
	case 1: // the common case
		sd := sends[0]
		sd.resp, sd.err = s.send(ctx, sd)
		return
	}
	started := make([]*heal.Sending, len(sends))
	var wg sync.WaitGroup
	for i, sd := range sends {
		if !sd.batched {
			wg.Go(func() { sd.resp, sd.err = s.send(ctx, sd) })
			continue
		}
		started[i] = s.heal.Start(ctx, sd.to, sd.req)
	}
	for i, sd := range sends {
		if started[i] != nil {
			sd.resp, sd.err = s.heal.Finish(ctx, started[i])
		}
	}
	wg.Wait()
}

// send sends sd and waits for its answer, through package heal, which
// refuses at once a send to a member it suspects.
func (s *Service) send(ctx context.Context, sd *send) (*pb.CheckResponse, error) {
	switch {
	case sd.batched:
		return s.heal.Forward(ctx, sd.to, sd.req)
	case sd.kind == routePull:
		return s.heal.Send(ctx, sd.to, heal.Pull, sd.req)
	case sd.kind == routeRelay:
		return s.heal.Send(ctx, sd.to, heal.Relay, sd.req)
	}
	return s.heal.Send(ctx, sd.to, heal.Forward, sd.req)
}
