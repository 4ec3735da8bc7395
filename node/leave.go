package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ringlimit/ringlimit/cluster"
	"github.com/ringlimit/ringlimit/service"
)

// loops are the background parts of a running node that its steps of
// leaving stop one by one, rather than all at once when ctx ends.
type loops struct {
	gossip  *loop // memberlist
	service *loop // GLOBAL sync, hand-off, replication, probes, ring changes
	peers   *loop // the peer pool's batches
}

// leave is how a node leaves the cluster when Run's ctx ends (or a part
// fails): its steps run in order, all within ctx (but the final
// snapshot's write). Their order is the node's promise that no counter is
// lost or decided twice on the way out; each says why it is where it is.
func (n *Node) leave(ctx context.Context, parts loops) error {
	beginSnapshot, finishSnapshot := n.snaps.steps()
	var leftAt time.Time
	others := false // the ring had other members when this node left it
	return runSteps(ctx, n.log, []*step{
		{"stop accepting checks", func(ctx context.Context) error {
			n.health.Shutdown() // NOT_SERVING, so that balancers stop sending
			n.faces.Drain()     // clients end their streams, which GracefulStop waits for
			// Envoys fall back at once (a zero time-to-live) and open their
			// next quota stream elsewhere; their grants stay reserved on
			// the owners until they report on that stream.
			n.quotas.Drain(ctx)
			stopGRPC(ctx, n.grpcSrv)
			var respErr error
			if n.respSrv != nil {
				// Each connection answers the commands it has read, then closes.
				respErr = n.respSrv.Shutdown(ctx)
			}
			return errors.Join(respErr, n.httpSrv.Shutdown(ctx))
		}},
		// The final snapshot begins before any counter leaves: each
		// counter an owner takes goes into it as it is taken, so that
		// when the whole cluster stops at once, every node's snapshot
		// holds the counters it owned, whether the owners they went to
		// kept them or not (see package snapshot).
		beginSnapshot,
		// Counters go before gossip does, so that no key's new owner
		// decides it before its counter is there: until the others see
		// this node leave, it relays what they forward to it to the new
		// owners (see service.Service.Leave).
		{"hand off counters", func(ctx context.Context) error {
			n.svc.Leave()
			sent, left := n.svc.HandOffAll(ctx)
			// What is left (counters others handed here meanwhile, as when a
			// whole cluster stops at once) goes in the last hand-off.
			n.log.Info("handed off counters", "counters", sent, "left", left)
			return nil
		}},
		{"leave the cluster", func(ctx context.Context) error {
			others = n.members.Ring().Len() > 1
			err := parts.gossip.stop(ctx) // others stop routing to this node, cluster.FailGrace after they hear
			leftAt = time.Now()
			return err
		}},
		// The others keep a member that left in their rings for
		// cluster.FailGrace after gossip tells them, and forward its keys
		// here meanwhile: this node relays those to the keys' new owners
		// while its peer port is open; closed, the others would fail them
		// over to the heirs instead (the new owners, so exact, but each
		// after a failed dial, and decided_by failover: a rolling restart
		// of five showed 2,350 so). They may hand it counters meanwhile
		// too (a round's strays, a stand-in's give-back), which the next
		// step passes on, once no member routes here any more.
		{"wait for the others to drop it", func(ctx context.Context) error {
			if others {
				waitUntil(ctx, leftAt.Add(cluster.FailGrace+leaveSpread))
			}
			return nil
		}},
		{"hand off counters that arrived meanwhile", func(ctx context.Context) error {
			return handOffRest(ctx, n.svc, n.log, n.snaps != nil) // from others' hand-offs, before they saw this node leave
		}},
		{"flush GLOBAL hits", func(ctx context.Context) error {
			err := parts.service.stop(ctx)
			n.svc.FlushGlobal(ctx)
			return err
		}},
		// Once no loop can hand a counter off any more: the counters this
		// node still holds (refused, not delivered, or handed here by
		// others as they stopped) join those handed off.
		finishSnapshot,
		{"close the peer port", func(ctx context.Context) error {
			n.peerFace.Drain()
			stopGRPC(ctx, n.peerSrv)
			return nil
		}},
		// Once this node can neither decide a check nor take a counter,
		// and before its peer clients close: in strict mode, its last word
		// lets its keys' new owners decide them at once rather than after
		// the fence (see service.Service.SayLeft).
		{"say it has left", func(ctx context.Context) error {
			n.svc.SayLeft(ctx)
			return nil
		}},
		{"close peers", func(ctx context.Context) error {
			return parts.peers.stop(ctx)
		}},
	})
}

// leaveSpread is how long gossip takes to tell every member that this
// node has left: a few gossip rounds of 200 ms.
const leaveSpread = 500 * time.Millisecond

// waitUntil waits until t, or until ctx ends: a wait that shutdown's
// deadline cuts short is no failure.
func waitUntil(ctx context.Context, t time.Time) {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
	}
}

// restBudget bounds the last hand-off of shutdown when no member takes
// anything: the others are stopping too.
const restBudget = 2 * time.Second

// handOffRest is the last hand-off of shutdown: it hands off every counter
// this node still holds (those others handed it while it left) and
// reports, as an error, those it could not, which are lost when it exits.
// It goes on for as long as members take counters, restBudget at a time:
// once no member took any within restBudget, the owners of those left are
// gone or going (a whole cluster stopping at once, as helm uninstall
// does; their last hand-offs reach the members still up, which then hold
// counters for owners that have exited), and the counters are lost as the
// last node's are, logged, and not an error. Before, a node that some
// member answered went on until its shutdown timeout, trying owners that
// had exited, and exited with an error (a chaos run's stop of all five).
// With a snapshot, the counters are kept in it, to be loaded if this node
// starts again, and the log says so; the cluster running on has lost them
// all the same.
func handOffRest(ctx context.Context, svc *service.Service, log *slog.Logger, snapshot bool) error {
	lost := "they are lost when this node exits"
	if snapshot {
		lost = "they are kept only in this node's final snapshot"
	}
	window := func() (sent, left int) {
		budget, cancel := context.WithTimeout(ctx, restBudget)
		defer cancel()
		return svc.HandOffAll(budget)
	}
	sent, left := window()
	for took := sent; left > 0 && took > 0 && ctx.Err() == nil; sent += took {
		took, left = window() // some member answers: go on while one takes any
	}
	switch {
	case left == 0:
		log.Info("handed off counters", "counters", sent, "left", left)
		return nil
	case ctx.Err() == nil:
		log.Error("no member took the counters this node still holds: the cluster is stopping; "+lost,
			"left", left, "handed_off", sent, "waited", restBudget)
		return nil
	default:
		log.Error("counters not handed off; "+lost, "left", left, "handed_off", sent)
		return fmt.Errorf("%d counters not handed off", left)
	}
}

// step is one step of an orderly shutdown.
type step struct {
	name string
	run  func(ctx context.Context) error
}

// runSteps runs steps in order, each with what is left of ctx, logging
// each; a failed step does not stop the later ones, and a nil one (a part
// the node runs without) is skipped. It returns the errors.
func runSteps(ctx context.Context, log *slog.Logger, steps []*step) error {
	var errs []error
	for _, s := range steps {
		if s == nil {
			continue
		}
		start := time.Now()
		err := s.run(ctx)
		log.Info("shutdown step done", "step", s.name, "took", time.Since(start), "err", err)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
		}
	}
	return errors.Join(errs...)
}

// loop is a background part of a node that runs until its step of
// shutdown stops it.
type loop struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error // run's error, once done is closed
}

// startLoop runs run in g until the loop is stopped. An error of run
// other than its cancellation ends g's context, and so starts the
// shutdown, and is returned by stop and by g.Wait.
func startLoop(g *errgroup.Group, run func(context.Context) error) *loop {
	ctx, cancel := context.WithCancel(context.Background())
	l := &loop{cancel: cancel, done: make(chan struct{})}
	g.Go(func() error {
		defer close(l.done)
		l.err = ignoreCanceled(run(ctx))
		return l.err
	})
	return l
}

// stop ends the loop and waits for it to return, or for ctx to end.
func (l *loop) stop(ctx context.Context) error {
	l.cancel()
	select {
	case <-l.done:
		return l.err
	case <-ctx.Done():
		return ctx.Err()
	}
}
