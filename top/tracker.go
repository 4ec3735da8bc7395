package top

import (
	"context"
	"hash/maphash"
	"sync"
	"time"
)

// Defaults of Config.
const (
	DefaultNames  = 32
	DefaultKeys   = 32
	DefaultWindow = 10 * time.Second
)

// Hard bounds of Config, which also bound what a report read from another
// node may hold (Validate): 64 names of 2 × 64 keys of MaxKeyBytes are
// about 1 MB.
const (
	MaxNames = 64
	MaxKeys  = 64
)

// Config sizes a Tracker. Its zero fields mean their defaults.
type Config struct {
	// Names is how many limit names are tracked at once (at most
	// MaxNames), and Keys how many keys for each, in each of its two
	// sketches (at most MaxKeys).
	Names, Keys int
	// Window is how often Run starts a new interval: a report covers the
	// interval under way and the one before, between one and two windows.
	Window time.Duration
}

// Tracker counts, per limit name, the checks a node decided and those it
// refused, by key, in fixed memory. Record is the hot path: a lock, two
// hashes and a few map and heap steps, with no allocation. Run starts a
// new interval every Window; Report reads the counts. A nil *Tracker
// records nothing. A Tracker is safe for concurrent use.
type Tracker struct {
	seed   maphash.Seed
	window time.Duration

	mu        sync.Mutex
	cur, prev *interval
}

// interval is what a Tracker counted from start on.
type interval struct {
	start time.Time
	names *Sketch // the names by checks; slot i's keys are in hot[i] and refused[i]
	// hot counts each name's keys by checks, refused by refusals.
	hot, refused []Sketch
	refusals     uint64 // every refusal, exact (names.Total is every check)
}

func newInterval(names, keys int) *interval {
	in := &interval{names: NewSketch(names), hot: make([]Sketch, names), refused: make([]Sketch, names)}
	for i := range names {
		in.hot[i].init(keys)
		in.refused[i].init(keys)
	}
	return in
}

func (in *interval) reset(now time.Time) {
	in.start = now
	in.names.Reset()
	in.refusals = 0
	// A name's sketches are reset when its slot is taken (Record), so
	// that a reset costs the same whatever the number of names.
}

// New returns a Tracker sized by conf, whose first interval starts at now.
func New(conf Config, now time.Time) *Tracker {
	names := bounded(conf.Names, DefaultNames, MaxNames)
	keys := bounded(conf.Keys, DefaultKeys, MaxKeys)
	window := conf.Window
	if window <= 0 {
		window = DefaultWindow
	}
	t := &Tracker{seed: maphash.MakeSeed(), window: window, cur: newInterval(names, keys), prev: newInterval(names, keys)}
	t.cur.start = now
	t.prev.start = now
	return t
}

func bounded(v, def, max int) int {
	switch {
	case v <= 0:
		return def
	case v > max:
		return max
	}
	return v
}

// Record counts one check of key under the limit name, refused unless
// allowed.
func (t *Tracker) Record(name, key string, allowed bool) {
	if t == nil {
		return
	}
	hn := maphash.String(t.seed, name)
	hk := maphash.String(t.seed, key)
	t.mu.Lock()
	in := t.cur
	slot, fresh := in.names.Add(hn, name, 1)
	if slot >= 0 {
		if fresh {
			in.hot[slot].Reset()
			in.refused[slot].Reset()
		}
		in.hot[slot].Add(hk, key, 1)
		if !allowed {
			in.refused[slot].Add(hk, key, 1)
		}
	}
	if !allowed {
		in.refusals++
	}
	t.mu.Unlock()
}

// Rotate starts a new interval at now: the one under way becomes the one
// before, and the one before that is forgotten.
func (t *Tracker) Rotate(now time.Time) {
	t.mu.Lock()
	t.prev, t.cur = t.cur, t.prev
	t.cur.reset(now)
	t.mu.Unlock()
}

// Run rotates the intervals every Window until ctx ends.
func (t *Tracker) Run(ctx context.Context) error {
	tick := time.NewTicker(t.window)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case now := <-tick.C:
			t.Rotate(now)
		}
	}
}
