package node

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/snapshot"
)

// snapshots are a node's counters on disk (Config.SnapshotDir): loaded before
// it serves, written every Config.SnapshotInterval by a loop, and a last time
// at shutdown. A nil *snapshots is a node without them: its methods do
// nothing and it adds no shutdown step.
type snapshots struct {
	dir  *snapshot.Dir
	loop *loop
}

// openSnapshots opens conf.SnapshotDir, or returns nil without one. A
// directory that cannot be made or written to is an error: better to fail
// at start than to find out at the first snapshot.
func openSnapshots(conf Config, store *limiter.Store, log *slog.Logger, reg prometheus.Registerer) (*snapshots, error) {
	if conf.SnapshotDir == "" {
		return nil, nil
	}
	d, err := snapshot.Open(snapshot.Config{Dir: conf.SnapshotDir, Node: conf.NodeName, Store: store,
		Interval: conf.SnapshotInterval, Logger: log, Registerer: reg})
	if err != nil {
		return nil, fmt.Errorf("--snapshot-dir: %w", err)
	}
	return &snapshots{dir: d}, nil
}

// handedOff is what hand-off reports the counters others took to: into
// the final snapshot. Nil without snapshots.
func (s *snapshots) handedOff() func(records [][]byte) {
	if s == nil {
		return nil
	}
	return s.dir.HandedOff
}

// load merges the snapshot into the store, before the node serves or
// joins, so that it reports ready with its counters; counters it no
// longer owns are handed off once it has joined, as after any ring
// change.
func (s *snapshots) load(ctx context.Context, in checks.Intake) {
	if s != nil {
		s.dir.Load(ctx, in)
	}
}

// start runs the periodic snapshots in g until the shutdown step that
// starts the final snapshot stops them.
func (s *snapshots) start(g *errgroup.Group) {
	if s != nil {
		s.loop = startLoop(g, s.dir.Run)
	}
}

// steps returns the two shutdown steps of snapshots: the first goes
// before any counter is handed off, the second after the last hand-off
// and the GLOBAL flush. Both are nil without snapshots.
func (s *snapshots) steps() (begin, finish *step) {
	if s == nil {
		return nil, nil
	}
	return &step{"start the final snapshot", func(ctx context.Context) error {
			err := s.loop.stop(ctx) // no periodic snapshot from now on: it would miss what is handed off
			if serr := s.dir.StartFinal(); err == nil {
				err = serr
			}
			return err
		}}, &step{"write the final snapshot", func(context.Context) error {
			return s.dir.FinishFinal() // bounded by the store, not by what is left of the shutdown timeout
		}}
}
