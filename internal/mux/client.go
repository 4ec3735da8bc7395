// Package mux carries requests and their answers as the messages of one
// long-lived bidirectional gRPC stream, matched by an id, instead of one
// unary call each. grpc-go spends most of a small unary call on the call
// itself (a new HTTP/2 stream, header and trailer frames, a context, the
// method's dispatch), on both sides; a message on a stream that is open
// already costs a fraction of that. The Go client sends its batches to a
// node this way (RateLimiter/CheckStream), and a node its forwards to an
// owner (Peer/ForwardStream).
//
// A Client sends; Serve answers. Both keep the semantics of the unary call
// they replace: each request gets its own answer, or an error; a request
// refused whole gets a status in its answer and the stream goes on; the
// caller's deadline travels with the request. What a stream cannot do is
// refused as such (ErrRefused), so that the caller sends that request by
// the unary call instead: a node that does not serve the stream (an older
// version) or refuses it (too many streams, a peer it does not know yet).
//
// Serve decides each request on the goroutine that received it, which
// is the cheapest way for the requests a node decides in its own store,
// and would let one that waits (on another node, say) hold up the
// stream's next requests. So a request that waits hands the receiving
// over to another goroutine as it starts to wait, and nothing has to
// remember to: the context a handler gets does it when asked for Done,
// as everything that waits on a context asks, directly (a select), or
// through a derived context or a gRPC call. A request decided without
// waiting never asks, and costs what it did before: one allocation (its
// context) and no hand-over. Only a wait that cannot watch the context,
// a lock held across another node's answer, calls Detach first.
// TestWaitsDetachByThemselves holds Serve to this.
package mux

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ErrRefused is wrapped by the errors of calls that the stream could not
// carry, and that nothing has decided: the node does not serve the
// stream, refused to open it, or none is open and the last refusal was
// less than RetryAfter ago. The caller should send the request another
// way.
var ErrRefused = errors.New("stream refused")

// ErrClosed is the error of calls made after Close, and of calls in flight
// when it was called.
var ErrClosed = errors.New("stream client closed")

// RetryAfter is how long a Client sends nothing on a stream after the node
// refused it: a node of an older version refuses every stream, and a peer
// that does not know this node yet refuses its streams until gossip tells
// it.
const RetryAfter = 5 * time.Second

// maxQueued bounds the requests waiting for the sending goroutine of one
// stream; callers beyond it wait (or give up with their context).
const maxQueued = 64

// writeQuota is how many bytes of a stream's messages grpc-go lets wait to
// be written before a Send blocks (its transport's defaultWriteQuota):
// TestCallsBehindABlockedSendKeepTheirDeadlines fails should a version
// lower it under the bytes Call counts on.
const writeQuota = 64 << 10

// Config says how a Client opens its stream and reads its messages.
// Every field is required.
type Config[Req, Resp any] struct {
	// Open opens a stream; ctx ends when the stream is no longer wanted.
	// It should not block: Client calls it only when Ready says the
	// connection is up.
	Open func(ctx context.Context, opts ...grpc.CallOption) (grpc.BidiStreamingClient[Req, Resp], error)
	// Ready reports whether the connection is up, so that opening a stream
	// does not wait for it. While it is not, calls are refused: the unary
	// call that the caller makes instead connects, within its deadline.
	Ready func() bool
	// Stamp writes id, and the caller's timeout in milliseconds (rounded
	// up; 0 for none), into req.
	Stamp func(req *Req, id uint64, timeoutMs int64)
	// ID reads the id of an answer.
	ID func(resp *Resp) uint64
	// Size, if not nil, bounds a request's encoded size from above (its
	// fields; not gRPC's 5-byte header). With it, calls are sent from
	// their callers' goroutines while the requests unanswered on the
	// stream hold fewer than grpc-go's write quota of bytes (see Call);
	// without it, only while none is unanswered.
	Size func(req *Req) int
	// Header, if not nil, is given the header of each stream the node
	// answers, once, as its first answer arrives.
	Header func(md metadata.MD)
}

// Client sends requests on one stream at a time, opened on first use and
// again after it ends. It is safe for concurrent use. Each open stream has
// two goroutines, one sending and one receiving, which end with the
// stream; Close ends the stream and waits for them. Most calls are sent
// from their callers' goroutines (see Call).
type Client[Req, Resp any] struct {
	conf   Config[Req, Resp]
	base   context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the goroutines of streams

	mu      sync.Mutex
	cur     *stream[Req, Resp] // nil: none open
	nextID  uint64
	retryAt time.Time // no stream is opened before this
	closed  bool
}

// stream is one open stream and the requests in flight on it.
type stream[Req, Resp any] struct {
	s       grpc.BidiStreamingClient[Req, Resp]
	cancel  context.CancelFunc
	out     chan outgoing[Req] // to the sending goroutine
	closing chan struct{}      // closed when the node asks for the stream to end

	sendMu     sync.Mutex   // held by whoever sends: one Send at a time
	sendClosed bool         // the sending goroutine has closed the sending side; under sendMu
	aloft      atomic.Int64 // the sizes of the requests sent and not answered yet

	mu       sync.Mutex // guards what follows
	pending  map[uint64]waiter[Resp]
	ended    error // why the stream ended; nil while it is open
	answered bool  // an answer arrived: the node serves the stream
	drained  bool  // the node asked for the stream to end (see Server.Drain)
}

type result[Resp any] struct {
	resp *Resp
	err  error
}

// outgoing is a request for the sending goroutine, and its size as Call
// counts it.
type outgoing[Req any] struct {
	req  *Req
	size int64
}

// waiter is a request waiting for its answer: its caller's channel, nil
// once the caller has gone, and its size as Call counts it, which its
// answer takes off stream.aloft.
type waiter[Resp any] struct {
	ch   chan result[Resp]
	size int64
}

// NewClient returns a Client that opens its streams as conf says. It
// opens nothing yet.
func NewClient[Req, Resp any](conf Config[Req, Resp]) *Client[Req, Resp] {
	c := &Client[Req, Resp]{conf: conf}
	c.base, c.cancel = context.WithCancel(context.Background())
	return c
}

// Call sends req on the stream and returns its answer. It returns ctx's
// error as soon as ctx ends; the request, if sent, is then the node's to
// decide, as with a unary call whose caller gave up. An error wrapping
// ErrRefused means nothing decided req: send it another way. Call stamps
// req with an id and ctx's deadline, and must not be given the same req
// twice at once.
//
// A call is sent from the caller's goroutine, saving the hand-over to
// the sending goroutine (another goroutine to run, often a thread to
// wake), while none is queued for it and the requests unanswered on the
// stream are smaller than grpc-go's write quota (by Config.Size; without
// it, while none is unanswered): such a Send cannot block, since grpc-go
// blocks a stream's sends only once the quota of its messages waits to be
// written, and every message of a request answered has been. Other calls
// go through the sending goroutine, and their callers wait for the send
// with ctx.
func (c *Client[Req, Resp]) Call(ctx context.Context, req *Req) (*Resp, error) {
	st, id, err := c.stream()
	if err != nil {
		return nil, err
	}
	var timeout time.Duration
	if d, ok := ctx.Deadline(); ok {
		if timeout = time.Until(d); timeout <= 0 {
			st.forget(id, false)
			return nil, context.DeadlineExceeded
		}
	}
	c.conf.Stamp(req, id, (timeout + time.Millisecond - 1).Milliseconds())
	size := int64(writeQuota) // without Size, one request fills the quota
	if c.conf.Size != nil {
		size = int64(c.conf.Size(req)) + 5 // and gRPC's header
	}
	ch := st.waiting(id, size)
	if !st.sendNow(req, size) {
		select {
		case st.out <- outgoing[Req]{req, size}:
		case r := <-ch: // the stream ended
			return r.resp, r.err
		case <-ctx.Done():
			st.forget(id, false)
			return nil, ctx.Err()
		}
	}
	select {
	case r := <-ch:
		return r.resp, r.err
	case <-ctx.Done():
		st.forget(id, true)
		return nil, ctx.Err()
	}
}

// stream returns the open stream, opening one if none is, and reserves an
// id on it.
func (c *Client[Req, Resp]) stream() (*stream[Req, Resp], uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return nil, 0, ErrClosed
	case c.cur != nil:
	case time.Now().Before(c.retryAt):
		return nil, 0, fmt.Errorf("%w: refused less than %v ago", ErrRefused, RetryAfter)
	case !c.conf.Ready():
		return nil, 0, fmt.Errorf("%w: not connected", ErrRefused)
	default:
		ctx, cancel := context.WithCancel(c.base)
		s, err := c.conf.Open(ctx)
		if err != nil {
			cancel()
			c.retryAt = time.Now().Add(RetryAfter)
			return nil, 0, fmt.Errorf("%w: %w", ErrRefused, err)
		}
		st := &stream[Req, Resp]{s: s, cancel: cancel, out: make(chan outgoing[Req], maxQueued), closing: make(chan struct{}),
			pending: map[uint64]waiter[Resp]{}}
		c.cur = st
		c.wg.Go(func() { c.send(ctx, st) })
		c.wg.Go(func() { c.receive(st) })
	}
	c.nextID++
	return c.cur, c.nextID, nil
}

// waiting registers a call waiting for the answer to id, a request of
// size, and returns where the answer will come. If the stream has ended,
// the answer is its error, there already.
func (st *stream[Req, Resp]) waiting(id uint64, size int64) chan result[Resp] {
	ch := make(chan result[Resp], 1)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended != nil {
		ch <- result[Resp]{err: st.ended}
		return ch
	}
	st.pending[id] = waiter[Resp]{ch, size}
	return ch
}

// sendNow sends req, of size, from this goroutine if it cannot block (see
// Call): the requests unanswered hold fewer than writeQuota bytes, none is
// queued, no send is in progress, and the sending side is open. It
// reports whether it sent req; a failed send ends the stream, and the
// receiving goroutine fails the calls.
func (st *stream[Req, Resp]) sendNow(req *Req, size int64) bool {
	if st.aloft.Load() >= writeQuota || len(st.out) != 0 || !st.sendMu.TryLock() {
		return false
	}
	defer st.sendMu.Unlock()
	if st.aloft.Load() >= writeQuota || st.sendClosed { // added to under sendMu: exact
		return false
	}
	st.sendLocked(req, size)
	return true
}

// sendLocked sends req, counting its size aloft; the caller holds sendMu.
// A failed send ends the stream, and reports false.
func (st *stream[Req, Resp]) sendLocked(req *Req, size int64) bool {
	st.aloft.Add(size)
	if err := st.s.Send(req); err != nil {
		st.cancel() // the stream is broken: receive sees it and fails the calls
		return false
	}
	return true
}

// forget drops the caller waiting for id: it has gone. A request that was
// sent, or queued to be, stays pending without its caller until its
// answer comes, which takes its size off st.aloft; one that was not is
// dropped.
func (st *stream[Req, Resp]) forget(id uint64, sent bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	w, ok := st.pending[id]
	switch {
	case !ok:
	case sent:
		w.ch = nil
		st.pending[id] = w
	default:
		delete(st.pending, id)
	}
}

// send is the stream's only sender: it sends what callers queue until the
// stream ends, or until the node asks for it to end: then it sends what is
// queued and ends its side. A failed send ends the stream, and receive
// then reports why.
func (c *Client[Req, Resp]) send(ctx context.Context, st *stream[Req, Resp]) {
	for {
		var o outgoing[Req]
		select {
		case o = <-st.out:
		case <-st.closing:
			st.sendMu.Lock()
			defer st.sendMu.Unlock()
			for {
				select {
				case o = <-st.out:
					if !st.sendLocked(o.req, o.size) {
						return
					}
				default:
					st.sendClosed = true
					st.s.CloseSend()
					return
				}
			}
		case <-ctx.Done():
			return
		}
		st.sendMu.Lock()
		ok := st.sendLocked(o.req, o.size)
		st.sendMu.Unlock()
		if !ok {
			return
		}
	}
}

// receive is the stream's only receiver: it hands each answer to its
// caller until the stream ends, then fails the calls still waiting.
func (c *Client[Req, Resp]) receive(st *stream[Req, Resp]) {
	header := c.conf.Header
	for {
		resp, err := st.s.Recv()
		if err != nil {
			c.end(st, err)
			return
		}
		if header != nil {
			if md, err := st.s.Header(); err == nil { // at hand: an answer has come
				header(md)
			}
			header = nil
		}
		id := c.conf.ID(resp)
		if id == 0 {
			c.drained(st)
			continue
		}
		st.mu.Lock()
		w, ok := st.pending[id]
		delete(st.pending, id)
		st.answered = true
		st.mu.Unlock()
		if ok {
			st.aloft.Add(-w.size)
		}
		if w.ch != nil {
			w.ch <- result[Resp]{resp: resp}
		}
	}
}

// drained takes the node's word that it is stopping (see Server.Drain):
// later calls go another way for RetryAfter, while st's requests in flight
// are answered, and st ends.
func (c *Client[Req, Resp]) drained(st *stream[Req, Resp]) {
	st.mu.Lock()
	first := !st.drained
	st.drained = true
	st.mu.Unlock()
	if !first {
		return
	}
	c.mu.Lock()
	if c.cur == st {
		c.cur = nil
		c.retryAt = time.Now().Add(RetryAfter)
	}
	c.mu.Unlock()
	close(st.closing)
}

// end records that st ended with err, fails the calls waiting on it, and
// lets the next call open a new stream.
func (c *Client[Req, Resp]) end(st *stream[Req, Resp], err error) {
	st.cancel()
	st.mu.Lock()
	switch {
	case st.drained && errors.Is(err, io.EOF):
		// The node answered all it received before it ended the stream:
		// the calls still waiting were never received.
		err = fmt.Errorf("%w: the node ended the stream, stopping: %w", ErrRefused, err)
	case refused(err) && !st.answered:
		// Refused before any request was decided: nothing on it was.
		err = fmt.Errorf("%w: %w", ErrRefused, err)
	case errors.Is(err, io.EOF):
		err = status.Error(codes.Unavailable, "the node ended the stream")
	}
	if c.base.Err() != nil {
		err = ErrClosed
	}
	st.ended = err
	pending := st.pending
	st.pending = nil
	st.mu.Unlock()
	for _, w := range pending {
		if w.ch != nil {
			w.ch <- result[Resp]{err: err}
		}
	}
	c.mu.Lock()
	if c.cur == st {
		c.cur = nil
	}
	if errors.Is(err, ErrRefused) {
		c.retryAt = time.Now().Add(RetryAfter)
	}
	c.mu.Unlock()
}

// refused reports whether err is how a node refuses a stream before its
// handler runs: it does not serve the method (an older version), does not
// accept the caller (a peer it does not know yet), or has too many streams
// open.
func refused(err error) bool {
	switch status.Code(err) {
	case codes.Unimplemented, codes.PermissionDenied, codes.Unauthenticated, codes.ResourceExhausted:
		return true
	}
	return false
}

// Close ends the stream, failing the calls in flight with ErrClosed, and
// waits for its goroutines. Later calls fail with ErrClosed. Close is
// idempotent.
func (c *Client[Req, Resp]) Close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
}
