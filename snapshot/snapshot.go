// Package snapshot keeps a node's counters in a file, so that they survive
// a stop of the whole cluster (helm uninstall and install, every pod
// evicted at once), which hand-off and replicas cannot cover.
//
// A node with a snapshot directory writes its counters still charged
// (limiter.Store.Charged, a shard at a time, no lock held while writing)
// every Config.Interval (Run) and once more as it shuts down (StartFinal,
// FinishFinal), each write crash-safe (a temporary file, synced, renamed,
// the directory synced), and loads them when it starts (Load), before it
// serves or joins, validating every counter as one from a peer
// (checks.Intake): a snapshot is an input, not a trusted memory. The
// layout is in FORMAT.md; a file that is not one, of another node or
// version, truncated, corrupt or too large is refused whole, logged,
// counted and moved aside. See docs/snapshots.md.
package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
)

// DefaultInterval is how often, by default, a node writes its snapshot: a
// node killed with SIGKILL (or a machine that loses power) comes back
// with its counters as they were at most this long before.
const DefaultInterval = 10 * time.Second

// FileName is the snapshot's name in its directory; it is written as
// FileName.*.tmp first, and a file refused at load is moved to
// FileName.refused.
const FileName = "counters.snap"

const (
	tempPattern = FileName + ".*.tmp"
	refusedName = FileName + ".refused"
)

// Store is what snapshots need of the counter store: *limiter.Store.
type Store interface {
	// Charged yields the counters not back to full at now.
	Charged(now time.Time) iter.Seq[limiter.Counter]
	// Bounds returns the most counters, sliding-log entries and
	// reservations the store can hold.
	Bounds() (counters, logEntries, reservations int)
	checks.Merger
}

// Config configures a Dir. Dir, Node and Store are required.
type Config struct {
	// Dir is the directory the snapshot lives in, created (0700) if it
	// does not exist. One node's: another node's file in it is refused.
	Dir string
	// Node is this node's name, written into every snapshot and required
	// of the one it loads.
	Node  string
	Store Store
	// Interval is how often Run writes; zero means DefaultInterval.
	Interval time.Duration
	// LoadTimeout bounds a whole Load; zero means DefaultLoadTimeout.
	LoadTimeout time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives a line per load, per refused file and per failed
	// write; nil discards them.
	Logger *slog.Logger
	// Registerer receives the snapshot metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Dir is one node's snapshot directory. It is safe for concurrent use:
// one write at a time, and records handed to HandedOff go into the final
// snapshot, if one is open.
type Dir struct {
	dir, path string
	node      string
	store     Store
	interval  time.Duration
	loadLimit time.Duration // a Load's time bound
	now       func() time.Time
	log       *slog.Logger
	metrics   metrics
	// limits bound a file; one bounds one store's worth of it, what the
	// journal of a final snapshot may take (see StartFinal).
	limits, one Limits

	mu    sync.Mutex              // one write at a time
	final atomic.Pointer[pending] // the final snapshot, between StartFinal and FinishFinal
}

// Open returns the Dir of conf.Dir, after making sure a snapshot can be
// written there: it creates the directory if need be and a temporary file
// in it, which it removes. It starts nothing.
func Open(conf Config) (*Dir, error) {
	if conf.Node == "" || len(conf.Node) > peerpb.MaxNodeNameLen {
		return nil, fmt.Errorf("node name of %d bytes, want 1..%d for a snapshot", len(conf.Node), peerpb.MaxNodeNameLen)
	}
	if err := os.MkdirAll(conf.Dir, 0o700); err != nil {
		return nil, err
	}
	probe, err := os.CreateTemp(conf.Dir, tempPattern)
	if err != nil {
		return nil, fmt.Errorf("not writable: %w", err)
	}
	probe.Close()
	if err := os.Remove(probe.Name()); err != nil {
		return nil, err
	}
	counters, logEntries, reservations := conf.Store.Bounds()
	d := &Dir{dir: conf.Dir, path: filepath.Join(conf.Dir, FileName), node: conf.Node, store: conf.Store,
		interval: conf.Interval, loadLimit: conf.LoadTimeout, now: conf.Now, log: conf.Logger, metrics: newMetrics(conf.Registerer),
		limits: LimitsFor(counters, logEntries, reservations)}
	d.one = Limits{Counters: d.limits.Counters / 2, Bytes: d.limits.Bytes / 2}
	if d.interval <= 0 {
		d.interval = DefaultInterval
	}
	if d.loadLimit <= 0 {
		d.loadLimit = DefaultLoadTimeout
	}
	if d.now == nil {
		d.now = time.Now
	}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	return d, nil
}

// Run writes a snapshot every interval until ctx ends. A write that fails
// is logged and counted, and the next interval tries again; the file
// written last stays meanwhile. Run does not write when ctx ends: a node
// shutting down stops it and writes its final snapshot (StartFinal).
func (d *Dir) Run(ctx context.Context) error {
	t := time.NewTicker(d.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			d.Write(ctx)
		}
	}
}

// Write writes a snapshot of the store's charged counters now, replacing
// the last one once the new one is whole on disk. If ctx ends first, it
// stops and the last one stays. Failures are logged and counted too.
func (d *Dir) Write(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	w, err := d.create()
	if err == nil {
		err = w.addStore(ctx, d.store)
	}
	return d.commit(w, err)
}

// StartFinal begins the final snapshot of a node shutting down, before it
// hands any counter off: from now on HandedOff writes the record of every
// counter an owner takes from this node into it, and FinishFinal adds the
// counters the node still holds then. So the final snapshot holds every
// counter the node owned when it began to leave, however its hand-off
// fares: as a whole cluster stops, the peer a counter is handed to may be
// past its own final snapshot, or stopped. Stop Run first, and call
// FinishFinal once after it: no other write happens in between.
func (d *Dir) StartFinal() error {
	d.mu.Lock() // until FinishFinal: no other write in between
	w, err := d.create()
	if err != nil {
		d.metrics.writes.WithLabelValues("failed").Inc()
		d.log.Error("snapshot: cannot start the final snapshot; the last one written stays", "err", err)
		d.mu.Unlock()
		return err
	}
	d.final.Store(&pending{w: w})
	return nil
}

// HandedOff writes records, those of counters an owner took from this
// node, into the final snapshot, if one is open; else it does nothing.
// It takes at most one store's worth of records (a counter handed back
// and forth could come again and again); beyond that, the counters are
// with their owners.
func (d *Dir) HandedOff(records [][]byte) {
	p := d.final.Load()
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range records {
		if p.done || p.err != nil {
			return
		}
		if p.w.enc.Count() >= d.one.Counters || p.w.enc.Bytes()+int64(len(r)) > d.one.Bytes {
			p.dropped++
			continue
		}
		p.err = p.w.enc.Add(r)
	}
}

// FinishFinal adds the counters the store holds to the final snapshot,
// and makes it the node's snapshot. It is not bounded by a context: it
// takes as long as a periodic snapshot (see
// ringlimit_snapshot_duration_seconds), and a node killed before it ends
// keeps its last periodic snapshot. Without a final snapshot started, it
// does nothing.
func (d *Dir) FinishFinal() error {
	p := d.final.Swap(nil)
	if p == nil {
		return nil
	}
	defer d.mu.Unlock() // taken by StartFinal
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = true
	err := p.err
	journaled := p.w.enc.Count() // what hand-off sent, before the counters still held join them
	if err == nil {
		err = p.w.addStore(context.Background(), d.store)
	}
	if err = d.commit(p.w, err); err == nil {
		d.log.Info("snapshot: final snapshot written", "handed_off", journaled, "counters", p.w.enc.Count(),
			"dropped", p.dropped, "bytes", p.w.enc.Bytes())
	}
	return err
}

// pending is an open final snapshot.
type pending struct {
	mu      sync.Mutex
	w       *writing
	err     error // the first failure to add a record
	done    bool  // FinishFinal has taken it
	dropped int   // records beyond one store's worth
}

// Load reads the snapshot in the directory, if there is one, and merges
// its counters into the store through in, which validates each as a
// counter received from a peer, at the present time; it returns how many
// it took. It checks the file whole (magic, version, node name, lengths,
// count, checksum, bounds) before it merges any of it; a refused file (or
// a path that is not a regular file: see openRegular) is logged, counted
// by reason and moved to FileName.refused, and leftover temporary files
// are removed first. Load returns once ctx ends or Config.LoadTimeout has
// passed, between two reads or two counters, keeping what it merged and
// the file; the caller tells the two apart by ctx.Err.
func (d *Dir) Load(ctx context.Context, in checks.Intake) int {
	start := d.now()
	ctx, cancel := context.WithTimeout(ctx, d.loadLimit)
	defer cancel()
	d.removeLeftovers()
	f, err := openRegular(d.path)
	if errors.Is(err, fs.ErrNotExist) {
		d.log.Info("snapshot: none to load; starting empty", "path", d.path)
		return 0
	}
	if err != nil {
		d.refuse(err)
		return 0
	}
	defer f.Close()
	if info, err := f.Stat(); err == nil && info.Size() > d.limits.Bytes {
		d.refuse(fmt.Errorf("%d bytes, more than the %d this node's store could have written: %w", info.Size(), d.limits.Bytes, ErrTooLarge))
		return 0
	}
	r := ctxReader{ctx, f}
	h, err := Decode(r, d.limits, nil)
	if err == nil && h.Node != d.node {
		err = fmt.Errorf("written by node %q, this node is %q: %w", h.Node, d.node, ErrForeign)
	}
	if err == nil {
		_, err = f.Seek(0, 0)
	}
	if err != nil {
		if stop := ended(ctx); stop != nil {
			d.stopped(stop, 0)
			return 0
		}
		d.refuse(err)
		return 0
	}
	now := d.now()
	taken, refused := 0, map[string]int{}
	var first string
	cs := &peerpb.CounterState{}
	one := []*peerpb.CounterState{cs}
	_, err = Decode(r, d.limits, func(record []byte) error {
		cs.Counter = record // Intake copies what it keeps
		if r := in.Merge(d.store, one, now); len(r) > 0 {
			reason := checks.ReasonLabel(r[0].GetReason())
			refused[reason]++
			d.metrics.refused.WithLabelValues(reason).Inc()
			if first == "" {
				first = r[0].GetDetail()
			}
		} else {
			taken++
		}
		return ended(ctx)
	})
	d.metrics.loaded.Add(float64(taken))
	if len(refused) > 0 {
		d.log.Warn("snapshot: counters refused", "refused", refused, "first", first)
	}
	stop := ended(ctx)
	switch {
	case stop != nil:
		d.stopped(stop, taken)
		return taken
	case err != nil:
		// The file changed between the two reads: what was merged was
		// validated counter by counter; the rest is not loaded.
		d.log.Error("snapshot: load stopped part way", "path", d.path, "err", err, "loaded", taken)
		d.metrics.loadErrors.WithLabelValues(reasonOf(err)).Inc()
	}
	took := d.now().Sub(start)
	d.metrics.duration.WithLabelValues("load").Observe(took.Seconds())
	d.log.Info("snapshot loaded", "path", d.path, "counters", taken, "written", h.Written, "age", now.Sub(h.Written).Round(time.Millisecond), "took", took)
	return taken
}

// stopped logs and counts a load that ctx ended, by its time bound or a
// signal to stop, having merged taken counters. The file is left where it
// is: nothing was found wrong with it.
func (d *Dir) stopped(err error, taken int) {
	reason := reasonOf(err)
	d.metrics.loadErrors.WithLabelValues(reason).Inc()
	if reason == "timeout" {
		d.log.Error("snapshot: load stopped at its time bound; starting with what was loaded", "path", d.path,
			"timeout", d.loadLimit, "loaded", taken)
		return
	}
	d.log.Warn("snapshot: load stopped: the node is stopping", "path", d.path, "loaded", taken)
}

// refuse logs and counts a snapshot that cannot be loaded, and moves it
// aside, where it can be looked at, and where it no longer stands for
// this node's counters.
func (d *Dir) refuse(err error) {
	reason := reasonOf(err)
	d.metrics.loadErrors.WithLabelValues(reason).Inc()
	aside := filepath.Join(d.dir, refusedName)
	if rerr := os.Rename(d.path, aside); rerr != nil {
		aside = ""
	}
	d.log.Error("snapshot refused; starting empty", "path", d.path, "reason", reason, "err", err, "moved_to", aside)
}

// refusals are the reasons a file is refused, as the load_errors metric
// labels them; any other error is "io".
var refusals = [...]struct {
	err    error
	reason string
}{{ErrForeign, "foreign"}, {ErrUnknownVersion, "version"}, {ErrTruncated, "truncated"}, {ErrCorrupt, "corrupt"}, {ErrTooLarge, "too_large"},
	{ErrNotRegular, "not_regular"}, {context.DeadlineExceeded, "timeout"}, {context.Canceled, "canceled"}}

// reasonOf is the load_errors reason label of a Load error.
func reasonOf(err error) string {
	for _, r := range refusals {
		if errors.Is(err, r.err) {
			return r.reason
		}
	}
	return "io"
}

// removeLeftovers removes the temporary files of writes that did not
// finish (the process was killed mid-write): they never replaced the
// snapshot, and would only fill the disk.
func (d *Dir) removeLeftovers() {
	names, _ := filepath.Glob(filepath.Join(d.dir, tempPattern))
	for _, name := range names {
		if err := os.Remove(name); err != nil {
			d.log.Warn("snapshot: cannot remove a leftover temporary file", "path", name, "err", err)
			continue
		}
		d.log.Info("snapshot: removed the temporary file of a write that did not finish", "path", name)
	}
}
