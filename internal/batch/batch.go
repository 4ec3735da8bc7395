// Package batch gathers the calls bound for one destination into
// batches, adaptively: a call that finds no batch in flight goes at once,
// alone, so that idle traffic waits for nothing; calls that arrive while a
// batch is in flight are gathered, and the gathered batch goes when the
// batches in flight have returned, or sooner by the rules of its Config
// (enough items gathered, a wait passed, a bound reached). Under load
// batches grow by themselves, and a call waits for at most the batch
// ahead of it.
//
// The Go client batches a caller's checks to a node with it, and a node
// its forwards to a key's owner (package peer); Config holds the ways
// they differ.
package batch

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"
)

// Call is one caller's request waiting in a Batcher: a pointer, as a
// rule, since Do finds its own call with ==. Its methods may be called
// from any goroutine.
type Call interface {
	comparable
	// Size returns the call's items and encoded bytes, which the bounds
	// of a batch count. The Batcher asks as it takes the call, and again
	// as it sends it when Config.Observe is set.
	Size() (items, bytes int)
	// Left returns why the caller has stopped waiting (its context's
	// error, say), or nil while it waits. A call whose caller has left
	// is not sent: it is answered Fail(Left()) instead.
	Left() error
	// Fail answers the call with err, without sending it.
	Fail(err error)
}

// Config says how a Batcher sends and when a gathered batch goes. Send is
// required; every other zero field means its documented default.
type Config[C Call] struct {
	// Send sends calls as one batch and answers each; every caller is
	// still waiting (see Call.Left). ctx is the one given to Start or Run;
	// Send must give up when it ends. Send is called from the goroutine
	// of the caller whose call goes alone (Batcher.Do), or from a
	// goroutine of the Batcher's.
	Send func(ctx context.Context, calls []C)

	// MaxFlying is the most batches in flight at once. Zero means 1.
	MaxFlying int
	// SendAt is the items at which a gathered batch goes while others are
	// in flight (fewer than MaxFlying): a batch that has spread a
	// request's cost over that many items gains little by waiting for
	// more. Zero means MaxItems: only a batch that is closed goes early.
	SendAt int
	// Few is the items below which callers are few: while the most items
	// in flight and gathered at once lately are fewer than Few, a
	// gathered batch goes at once, whatever its size (while fewer than
	// MaxFlying are in flight). Few callers gain little by waiting for the
	// batch in flight, and several batches in flight have the destination
	// read the next request as it answers one. "Lately" is a peak that
	// loses an eighth as each batch returns: the callers of a batch that
	// has just returned come back one by one, and the first few must not
	// look few. Zero means none: a batch goes at once only when none is in
	// flight, or as SendAt says.
	Few int
	// Wait is the longest a gathered batch waits, from its first call,
	// for the batches in flight to return: then it goes as SendAt lets it
	// go (while fewer than MaxFlying are in flight). Zero means no bound:
	// it waits for at most the batch ahead of it, about one round trip.
	Wait time.Duration

	// A batch is closed, and goes as SendAt lets it, when it holds
	// MaxItems items, MaxBytes bytes or MaxCalls calls, or when the next
	// call would take it over MaxItems or MaxBytes: that call starts the
	// next batch. A call larger than these goes in a batch of its own.
	// Zero means no bound.
	MaxItems, MaxBytes, MaxCalls int

	// Observe, if not nil, is told the items of each batch as it is sent
	// (its callers that have left not counted): a metric of batch sizes.
	Observe func(items int)

	// Stopped is the error of the calls gathered when Run's context ends,
	// and of those added later. Nil means the context's cause.
	Stopped error
}

// Batcher gathers calls into batches and sends them (see the package
// comment, and Config for when a batch goes). It sends nothing until
// Start or Run gives it a context. It is safe for concurrent use.
type Batcher[C Call] struct {
	conf      Config[C]
	maxFlying int
	sendAt    int

	mu      sync.Mutex
	ctx     context.Context // nil until Start: nothing is sent
	err     error           // why Close was called; nil while open
	closed  chan struct{}   // closed by Close
	flying  int             // batches in flight
	aloft   int             // items in flight
	waiting int             // items gathered
	peak    int             // the most items in flight and gathered, lately (see Config.Few)
	queue   []*gathered[C]  // gathered, oldest first; only the last takes more calls
	timer   *time.Timer     // Config.Wait of timed; made on first use
	timed   *gathered[C]    // the batch timer runs for; nil when it runs for none
	flights sync.WaitGroup  // the Batcher's goroutines that send
}

// gathered is a batch being gathered.
type gathered[C Call] struct {
	calls        []C
	items, bytes int
	waited       bool // Config.Wait has passed since its first call
	first        [1]C // calls' first array: a batch of one call, as few callers' are, is one allocation
}

// newGathered returns an empty batch.
func newGathered[C Call]() *gathered[C] {
	g := &gathered[C]{}
	g.calls = g.first[:0]
	return g
}

// New returns a Batcher configured by conf. It starts nothing.
func New[C Call](conf Config[C]) *Batcher[C] {
	b := &Batcher[C]{conf: conf, maxFlying: max(conf.MaxFlying, 1), sendAt: conf.SendAt, closed: make(chan struct{})}
	if b.sendAt <= 0 {
		b.sendAt = bound(conf.MaxItems)
	}
	return b
}

// bound is n as a bound: no bound for 0.
func bound(n int) int {
	if n <= 0 {
		return math.MaxInt
	}
	return n
}

// fits reports whether a call of items and bytes may join g.
func (b *Batcher[C]) fits(g *gathered[C], items, bytes int) bool {
	return len(g.calls) < bound(b.conf.MaxCalls) && g.items+items <= bound(b.conf.MaxItems) && g.bytes+bytes <= bound(b.conf.MaxBytes)
}

// full reports whether g is at one of its bounds. (A batch that the next
// call did not fit is closed too, though not full: it is not the last.)
func (b *Batcher[C]) full(g *gathered[C]) bool {
	return len(g.calls) >= bound(b.conf.MaxCalls) || g.items >= bound(b.conf.MaxItems) || g.bytes >= bound(b.conf.MaxBytes)
}

// Add hands c to b, which answers it (Config.Send, or c.Fail) and does
// not wait: a batch that goes now goes from a goroutine of b's. A closed
// Batcher fails c with its error.
func (b *Batcher[C]) Add(c C) { b.add(c, false) }

// Do is Add, except that when c goes at once, alone, it is sent from this
// goroutine, and Do returns once Send has returned: a call to an idle
// destination then costs no goroutine and no hand-over.
func (b *Batcher[C]) Do(c C) { b.add(c, true) }

func (b *Batcher[C]) add(c C, inline bool) {
	items, bytes := c.Size()
	b.mu.Lock()
	if err := b.err; err != nil {
		b.mu.Unlock()
		c.Fail(err)
		return
	}
	k := len(b.queue)
	fresh := k == 0 || !b.fits(b.queue[k-1], items, bytes)
	if fresh {
		b.queue = append(b.queue, newGathered[C]())
	}
	g := b.queue[len(b.queue)-1]
	g.calls = append(g.calls, c)
	g.items += items
	g.bytes += bytes
	b.waiting += items
	b.peak = max(b.peak, b.aloft+b.waiting)
	var buf [dueBuf]*gathered[C]
	due := b.due(buf[:0])
	if fresh && b.conf.Wait > 0 && len(b.queue) > 0 && b.queue[len(b.queue)-1] == g {
		b.time(g) // g is gathered: its wait starts now
	}
	var mine *gathered[C]
	if inline {
		for i, d := range due {
			if len(d.calls) == 1 && d.calls[0] == c {
				mine, due = d, append(due[:i:i], due[i+1:]...)
				break
			}
		}
	}
	b.flights.Add(len(due))
	b.mu.Unlock()
	for _, d := range due {
		go b.fly(d)
	}
	if mine != nil {
		b.send(mine)
		b.land(mine, false)
	}
}

// time starts the timer for g, the last batch. The caller holds b.mu.
func (b *Batcher[C]) time(g *gathered[C]) {
	b.timed = g
	if b.timer == nil {
		b.timer = time.AfterFunc(b.conf.Wait, b.expire)
		return
	}
	b.timer.Reset(b.conf.Wait)
}

// expire marks the batch the timer ran for as having waited, and sends
// what is due.
func (b *Batcher[C]) expire() {
	b.mu.Lock()
	if b.timed != nil {
		b.timed.waited = true
		b.timed = nil
	}
	b.flyDue()
}

// flyDue sends the batches due, each from a goroutine of its own. The
// caller holds b.mu, which flyDue releases: the goroutines are counted in
// b.flights under it, so that Run, once b is closed, waits for each.
func (b *Batcher[C]) flyDue() {
	var buf [dueBuf]*gathered[C]
	due := b.due(buf[:0])
	b.flights.Add(len(due))
	b.mu.Unlock()
	for _, d := range due {
		go b.fly(d)
	}
}

// dueBuf is the batches due at once that the callers of due hold
// without an allocation.
const dueBuf = 4

// due takes the batches that may go now off b's queue, counting them in
// flight, and appends them to out: the oldest when none is in flight,
// and while fewer than MaxFlying are, ones that are closed, hold SendAt
// items or have waited Config.Wait. The caller holds b.mu.
func (b *Batcher[C]) due(out []*gathered[C]) []*gathered[C] {
	if b.ctx == nil {
		return out
	}
	for len(b.queue) > 0 && b.flying < b.maxFlying {
		g := b.queue[0]
		ready := len(b.queue) > 1 || g.items >= b.sendAt || g.waited || b.full(g) || b.few()
		if b.flying > 0 && !ready {
			break
		}
		b.queue = slices.Delete(b.queue, 0, 1) // the queue is short; its array is kept for the next batch
		b.flying++
		b.aloft += g.items
		b.waiting -= g.items
		out = append(out, g)
		if g == b.timed {
			b.timer.Stop()
			b.timed = nil
		}
	}
	if len(b.queue) == 0 && cap(b.queue) > keptQueue {
		b.queue = nil // let a long queue's array go
	}
	return out
}

// keptQueue is the longest queue array an empty queue keeps.
const keptQueue = 16

// few reports whether the callers are few (see Config.Few). The caller
// holds b.mu.
func (b *Batcher[C]) few() bool {
	return b.peak < b.conf.Few
}

// fly sends g, and then the batches that became due meanwhile, the first
// of them from this goroutine. It is counted in b.flights.
func (b *Batcher[C]) fly(g *gathered[C]) {
	defer b.flights.Done()
	for g != nil {
		b.send(g)
		g = b.land(g, true)
	}
}

// land counts g back from flight and sends the batches now due, each
// from a goroutine of its own, except that with keep it returns the
// first, for the caller to send; it returns nil otherwise.
func (b *Batcher[C]) land(g *gathered[C], keep bool) *gathered[C] {
	b.mu.Lock()
	b.flying--
	b.aloft -= g.items
	b.peak -= (b.peak + 7) / 8 // an eighth, rounded up: it comes down to 0
	var buf [dueBuf]*gathered[C]
	due := b.due(buf[:0])
	var first *gathered[C]
	if keep && len(due) > 0 {
		first, due = due[0], due[1:]
	}
	b.flights.Add(len(due))
	b.mu.Unlock()
	for _, d := range due {
		go b.fly(d)
	}
	return first
}

// send sends g's calls whose callers still wait, and answers the others.
func (b *Batcher[C]) send(g *gathered[C]) {
	live := g.calls[:0] // g is this flight's own
	items := 0
	for _, c := range g.calls {
		if err := c.Left(); err != nil {
			c.Fail(err)
			continue
		}
		live = append(live, c)
		if b.conf.Observe != nil {
			n, _ := c.Size()
			items += n
		}
	}
	if len(live) == 0 {
		return
	}
	if b.conf.Observe != nil {
		b.conf.Observe(items)
	}
	b.conf.Send(b.ctx, live) // set once, before any batch went
}

// Start makes b send its batches under ctx, from now on; until it is
// called, calls are gathered and nothing is sent. Start does not wait,
// and nothing waits for the goroutines that send: they end when their
// Send does, which ends with ctx. Calling Start again, or after Close,
// does nothing.
func (b *Batcher[C]) Start(ctx context.Context) {
	b.mu.Lock()
	if b.ctx != nil || b.err != nil {
		b.mu.Unlock()
		return
	}
	b.ctx = ctx
	b.flyDue()
}

// Run is Start for an owner that waits for b: it sends b's batches under
// ctx until ctx ends (then it closes b with Config.Stopped) or b is
// closed, and returns once every batch sent from b's goroutines has
// returned. It returns nil.
func (b *Batcher[C]) Run(ctx context.Context) error {
	b.Start(ctx)
	select {
	case <-ctx.Done():
		err := b.conf.Stopped
		if err == nil {
			err = context.Cause(ctx)
		}
		b.Close(err)
	case <-b.closed:
	}
	b.flights.Wait()
	return nil
}

// Close makes b fail its gathered calls, and every call added later, with
// err; batches in flight go on. Closing twice does nothing.
func (b *Batcher[C]) Close(err error) {
	b.mu.Lock()
	if b.err != nil {
		b.mu.Unlock()
		return
	}
	b.err = err
	close(b.closed)
	queue := b.queue
	b.queue = nil
	b.waiting = 0
	if b.timed != nil {
		b.timer.Stop()
		b.timed = nil
	}
	b.mu.Unlock()
	for _, g := range queue {
		for _, c := range g.calls {
			c.Fail(err)
		}
	}
}

// Gathered returns how many calls wait in b's batches, not sent yet.
func (b *Batcher[C]) Gathered() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, g := range b.queue {
		n += len(g.calls)
	}
	return n
}
