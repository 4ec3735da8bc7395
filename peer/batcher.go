package peer

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// call is one caller's request waiting in a batcher.
type call struct {
	ctx   context.Context // the caller's; a call whose ctx has ended is not sent
	req   *pb.CheckRequest
	items int
	bytes int         // req's encoded size
	res   chan result // cap 1, so the batcher's one send never blocks
}

type result struct {
	resp *pb.CheckResponse
	err  error
}

// sendFunc sends one batch to a peer and returns one response per request,
// in order. It must give up when ctx ends.
type sendFunc func(ctx context.Context, reqs []*pb.CheckRequest) ([]*pb.CheckResponse, error)

// batcher gathers the requests bound for one peer into batches. Any number
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
	inFlight int // sends at once
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
	c := &call{ctx: ctx, req: req, items: len(req.GetRequests()), bytes: proto.Size(req), res: make(chan result, 1)}
	select {
	case b.in <- c:
	case <-b.gone:
		return nil, b.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	// run now owns c and answers it, even when it stops.
	select {
	case r := <-c.res:
		return r.resp, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// run collects calls into batches and sends each batch from a goroutine of
// its own, at most b.inFlight at once, so that it keeps collecting while a
// batch is on the wire. A batch is sent when it holds b.limit items, or
// b.wait after its first call arrived, or when it holds b.maxBytes encoded
// bytes or MaxForwardItems requests, so that the peer server never refuses
// it for its size. A call that would take a non-empty batch over b.limit
// items or b.maxBytes goes into the next batch instead.
//
// run returns when ctx ends or b is retired, failing the calls still
// collected, and only after every send it started has finished. Sends use
// ctx, so ending ctx also ends the RPCs in flight. run always returns nil.
func (b *batcher) run(ctx context.Context) error {
	var sends errgroup.Group
	sends.SetLimit(b.inFlight) // Go blocks while that many are in flight: back-pressure
	timer := time.NewTimer(b.wait)
	timer.Stop() // since Go 1.23, a stopped timer never delivers a stale tick
	var batch []*call
	items, bytes := 0, 0
	flush := func() {
		timer.Stop()
		if len(batch) == 0 {
			return
		}
		calls := batch
		batch, items, bytes = nil, 0, 0
		sends.Go(func() error {
			b.flush(ctx, calls)
			return nil
		})
	}
	for {
		select {
		case c := <-b.in:
			if len(batch) > 0 && (items+c.items > b.limit || bytes+c.bytes > b.maxBytes) {
				flush()
			}
			if len(batch) == 0 {
				timer.Reset(b.wait)
			}
			batch = append(batch, c)
			items += c.items
			bytes += c.bytes
			if items >= b.limit || bytes >= b.maxBytes || len(batch) >= MaxForwardItems {
				flush()
			}
		case <-timer.C:
			flush()
		case <-ctx.Done():
			timer.Stop()
			fail(batch, ErrClosed)
			return sends.Wait()
		case <-b.gone:
			timer.Stop()
			fail(batch, b.err)
			return sends.Wait()
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
		if c.ctx.Err() != nil {
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
