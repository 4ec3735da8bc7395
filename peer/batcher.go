package peer

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/batch"
	"github.com/ringlimit/ringlimit/internal/wire"
)

// call is one caller's request waiting in a batcher.
type call struct {
	ctx   context.Context // the caller's; a call whose ctx has ended is not sent
	req   *pb.CheckRequest
	items int
	bytes int         // req's encoded size
	res   chan result // cap 1: a call is answered once, and the answer never blocks
	// left is set when the caller stops waiting for another reason than
	// ctx (a deadline of the wait's own, or its owner's suspicion): the
	// call is not sent either.
	left atomic.Bool
}

type result struct {
	resp *pb.CheckResponse
	err  error
}

// errLeft is the answer to a call whose caller stopped waiting for
// another reason than its context: no one reads it.
var errLeft = errors.New("the caller stopped waiting")

func (c *call) Size() (items, bytes int) { return c.items, c.bytes }

func (c *call) Left() error {
	if err := c.ctx.Err(); err != nil {
		return err
	}
	if c.left.Load() {
		return errLeft
	}
	return nil
}

func (c *call) Fail(err error) { c.res <- result{err: err} }

// sendFunc sends one batch to a peer and returns one response per request,
// in order. It must give up when ctx ends.
type sendFunc func(ctx context.Context, reqs []*pb.CheckRequest) ([]*pb.CheckResponse, error)

// batcher gathers the requests bound for one peer into batches, by the
// rules of package batch: at most maxInFlight batches in flight; a
// gathered batch goes when they have returned, when it is closed (at
// Config.BatchLimit items, MaxForwardBytes encoded bytes or
// MaxForwardItems requests, so that the peer server never refuses it for
// its size), or Config.BatchWait after its first request. Batches go
// under the context of its Run, which the Pool runs; until then they
// gather. The Pool closes a batcher to fail its gathered calls and
// refuse new ones (batch.Batcher.Close).
type batcher struct {
	*batch.Batcher[*call]
	started bool // its Run was started; guarded by the Pool's lock
}

// newBatcher returns a batcher that closes batches at limit items and
// maxBytes bytes, and sends them with send, telling size the items of
// each.
func newBatcher(wait time.Duration, limit, maxBytes int, send sendFunc, size prometheus.Observer) *batcher {
	return &batcher{Batcher: batch.New(batch.Config[*call]{
		Send:      func(ctx context.Context, calls []*call) { flush(ctx, send, calls) },
		MaxFlying: maxInFlight,
		Wait:      wait,
		MaxItems:  limit,
		MaxBytes:  maxBytes,
		MaxCalls:  MaxForwardItems,
		Observe:   func(items int) { size.Observe(float64(items)) },
		Stopped:   ErrClosed,
	})}
}

// do hands req to b and waits for the peer's response to it. It returns
// ctx.Err() as soon as ctx ends, and b's error if b is closed before
// sending req. do is safe for concurrent use.
func (b *batcher) do(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	return b.submit(ctx, req).wait(nil, nil)
}

// submit hands req to b, which then owns the call and answers it, even
// when it is closed. It does not wait.
func (b *batcher) submit(ctx context.Context, req *pb.CheckRequest) *call {
	c := &call{ctx: ctx, req: req, items: len(req.GetRequests()), bytes: wire.Size(req), res: make(chan result, 1)}
	b.Add(c)
	return c
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

// flush sends calls as one batch with send, under the batcher's ctx, and
// answers each call.
func flush(ctx context.Context, send sendFunc, calls []*call) {
	reqs := make([]*pb.CheckRequest, len(calls))
	for i, c := range calls {
		reqs[i] = c.req
	}
	resps, err := send(ctx, reqs)
	switch {
	case err != nil && ctx.Err() != nil:
		err = ErrClosed // the pool stopped under the RPC
	case err == nil && len(resps) != len(reqs):
		err = fmt.Errorf("peer answered %d of %d requests", len(resps), len(reqs))
	}
	for i, c := range calls {
		if err != nil {
			c.Fail(err)
			continue
		}
		c.res <- result{resp: resps[i]}
	}
}
