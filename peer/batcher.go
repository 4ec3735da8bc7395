package peer

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/wire"
)

// call is one caller's request waiting in a batcher.
type call struct {
	ctx   context.Context // the caller's; a call whose ctx has ended is not sent
	req   *pb.CheckRequest
	items int
	bytes int         // req's encoded size
	res   chan result // cap 1, so the batcher's one send never blocks
	// left is set when the caller stops waiting for another reason than
	// ctx (a deadline of the wait's own, or its owner's suspicion): the
	// call is not sent either.
	left atomic.Bool
}

// gone reports whether c's caller has stopped waiting.
func (c *call) gone() bool { return c.ctx.Err() != nil || c.left.Load() }

type result struct {
	resp *pb.CheckResponse
	err  error
}

// sendFunc sends one batch to a peer and returns one response per request,
// in order. It must give up when ctx ends.
type sendFunc func(ctx context.Context, reqs []*pb.CheckRequest) ([]*pb.CheckResponse, error)

// batcher gathers the requests bound for one peer into batches (see run for
// when a batch is sent). Any number
// of goroutines may call do; run, started once by the batcher's owner, is
// the only reader of in. The owner retires a batcher to make it refuse new
// calls and make run fail the pending ones and return.
type batcher struct {
	in       chan *call // unbuffered: a call handed over is a call run will answer
	gone     chan struct{}
	err      error // why gone was closed; written before close(gone), read after
	wait     time.Duration
	limit    int // items
	maxBytes int // encoded bytes
	inFlight int // most sends in flight at once
	send     sendFunc
	size     prometheus.Observer

	// started and retired are guarded by the owner's lock.
	started, retired bool
}

func newBatcher(wait time.Duration, limit, inFlight int, send sendFunc, size prometheus.Observer) *batcher {
	return &batcher{
		in:       make(chan *call),
		gone:     make(chan struct{}),
		wait:     wait,
		limit:    limit,
		maxBytes: MaxForwardBytes,
		inFlight: inFlight,
		send:     send,
		size:     size,
	}
}

// retire makes b refuse new calls with err, and makes run fail its pending
// calls with err and return. The caller must hold the owner's lock; retiring
// twice does nothing.
func (b *batcher) retire(err error) {
	if b.retired {
		return
	}
	b.retired = true
	b.err = err
	close(b.gone)
}

// do hands req to b's loop and waits for the peer's response to it. It
// returns ctx.Err() as soon as ctx ends, and b's retirement error if b is
// retired before taking req. do is safe for concurrent use.
func (b *batcher) do(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	c, err := b.submit(ctx, req, nil)
	if err != nil {
		return nil, err
	}
	return c.wait(nil, nil)
}

// submit hands req to b's loop, which then owns the call and answers it,
// even when it stops. It returns ctx.Err() if ctx ends first, a deadline
// error if expire yields first (nil: never), and b's retirement error if b
// is retired before taking req.
func (b *batcher) submit(ctx context.Context, req *pb.CheckRequest, expire <-chan time.Time) (*call, error) {
	c := &call{ctx: ctx, req: req, items: len(req.GetRequests()), bytes: wire.Size(req), res: make(chan result, 1)}
	select {
	case b.in <- c:
		return c, nil
	case <-b.gone:
		return nil, b.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-expire:
		return nil, context.DeadlineExceeded
	}
}

// errStopped is the error of a wait that its stop channel ended.
var errStopped = errors.New("stopped waiting")

// wait waits for the answer to c. It gives up, and c is not sent if it
// has not been, when c's caller's context ends (returning its error),
// when expire yields (context.DeadlineExceeded) or when stop is closed
// (errStopped); nil channels never do.
func (c *call) wait(expire <-chan time.Time, stop <-chan struct{}) (*pb.CheckResponse, error) {
	var err error
	select {
	case r := <-c.res:
		return r.resp, r.err
	case <-c.ctx.Done():
		err = c.ctx.Err()
	case <-expire:
		err = context.DeadlineExceeded
	case <-stop:
		err = errStopped
	}
	c.left.Store(true)
	return nil, err
}

// gathered is the batch a batcher is collecting.
type gathered struct {
	calls        []*call
	items, bytes int
}

// run collects calls into batches, adaptively: a call that arrives when no
// batch to the peer is in flight is sent at once, alone, so that idle
// traffic pays no batching delay. Calls that arrive while a batch is in
// flight are gathered, and the gathered batch is sent as soon as one of
//
//   - no batch is in flight any more (the last one returned),
//   - the batch holds b.limit items, b.maxBytes encoded bytes or
//     MaxForwardItems requests (so that the peer server never refuses it
//     for its size), or the next call would take it over b.limit or
//     b.maxBytes (that call then starts the next batch),
//   - b.wait has passed since its first call arrived,
//
// whichever comes first. The last two send it even while other batches are
// in flight, so up to b.inFlight batches may be in flight at once: a slow
// peer then costs a caller at most b.wait of gathering, not a whole round
// trip more. A return with others still in flight sends nothing: under load
// that would keep b.inFlight small batches in flight, and more RPCs cost
// the CPU that load lacks. With b.inFlight in flight, a batch that is due
// waits for one to return and run takes no new calls meanwhile:
// back-pressure.
//
// Each batch is sent from a goroutine of its own, so that run keeps
// collecting while it is on the wire. run returns when ctx ends or b is
// retired, failing the calls still collected, and only after every send it
// started has finished. Sends use ctx, so ending ctx also ends the RPCs in
// flight. run always returns nil.
func (b *batcher) run(ctx context.Context) error {
	returned := make(chan struct{}, b.inFlight) // one value per finished send
	flying := 0                                 // sends started and not yet returned
	timer := time.NewTimer(b.wait)
	timer.Stop() // since Go 1.23, a stopped timer never delivers a stale tick
	var (
		batch gathered
		due   bool  // batch is full or its wait is over: send it at the first free slot
		held  *call // the call that did not fit in batch; it starts the next
	)
	add := func(c *call) {
		if len(batch.calls) == 0 {
			timer.Reset(b.wait)
		}
		batch.calls = append(batch.calls, c)
		batch.items += c.items
		batch.bytes += c.bytes
		due = batch.items >= b.limit || batch.bytes >= b.maxBytes || len(batch.calls) >= MaxForwardItems
	}
	stop := func(err error) error {
		timer.Stop()
		fail(batch.calls, err)
		if held != nil {
			fail([]*call{held}, err)
		}
		for ; flying > 0; flying-- {
			<-returned
		}
		return nil
	}
	for {
		for len(batch.calls) > 0 && flying < b.inFlight && (flying == 0 || due) {
			timer.Stop()
			calls := batch.calls
			batch, due = gathered{}, false
			flying++
			go func() {
				b.flush(ctx, calls)
				returned <- struct{}{}
			}()
			if held != nil {
				add(held)
				held = nil
			}
		}
		in := b.in
		if due {
			in = nil // every send slot is taken: wait for one to return
		}
		select {
		case c := <-in:
			if len(batch.calls) > 0 && (batch.items+c.items > b.limit || batch.bytes+c.bytes > b.maxBytes) {
				due, held = true, c
				continue
			}
			add(c)
		case <-returned:
			flying-- // at 0, the loop's head sends what gathered meanwhile
		case <-timer.C:
			due = true
		case <-ctx.Done():
			return stop(ErrClosed)
		case <-b.gone:
			return stop(b.err)
		}
	}
}

// flush sends calls as one batch and answers each call. Calls whose caller
// has already left are not sent.
func (b *batcher) flush(ctx context.Context, calls []*call) {
	live := calls[:0]
	reqs := make([]*pb.CheckRequest, 0, len(calls))
	items := 0
	for _, c := range calls {
		if c.gone() {
			continue
		}
		live = append(live, c)
		reqs = append(reqs, c.req)
		items += c.items
	}
	if len(live) == 0 {
		return
	}
	b.size.Observe(float64(items))
	resps, err := b.send(ctx, reqs)
	switch {
	case err != nil && ctx.Err() != nil:
		err = ErrClosed // the pool stopped under the RPC
	case err == nil && len(resps) != len(reqs):
		err = fmt.Errorf("peer answered %d of %d requests", len(resps), len(reqs))
	}
	if err != nil {
		fail(live, err)
		return
	}
	for i, c := range live {
		c.res <- result{resp: resps[i]}
	}
}

// fail answers every call with err.
func fail(calls []*call, err error) {
	for _, c := range calls {
		c.res <- result{err: err}
	}
}
