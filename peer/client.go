package peer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
)

// Forward asks the owner at addr to decide req, batched with concurrent
// calls bound for the same addr (see Config.BatchWait and BatchLimit). It
// needs Run to be running. It returns as soon as ctx ends, and at the
// latest after Config.Timeout, with an error wrapping ErrUnreachable if the
// peer could not be reached or answer in time. Forward is safe for
// concurrent use and does not modify req.
func (p *Pool) Forward(ctx context.Context, addr string, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	return p.Start(ctx, addr, req).Wait(nil)
}

// Forwarding is a batched forward on its way to its owner: see
// Pool.Start. (An interface, so that a fake of the Pool can make its own.)
type Forwarding interface {
	// Wait returns the owner's answer, as Pool.Forward does. It also gives
	// up, with an error wrapping ErrUnreachable, when stop is closed (nil:
	// never): the caller has learned that the owner cannot answer. A
	// forward that gives up before its batch is sent is not sent. Wait may
	// be called once.
	Wait(stop <-chan struct{}) (*pb.CheckResponse, error)
}

// forwarding is the Pool's Forwarding.
type forwarding struct {
	p      *Pool
	addr   string
	start  time.Time
	expire *time.Timer // Config.Timeout after Start
	c      *call       // nil when err is set
	err    error       // why the forward failed before reaching a batcher
}

// Start is Forward in two steps, so that a caller with several owners to
// ask asks them all before it waits for one: it hands req to the batcher
// of the owner at addr, without waiting, and returns the forward, whose
// Wait returns the answer.
func (p *Pool) Start(ctx context.Context, addr string, req *pb.CheckRequest) Forwarding {
	f := &forwarding{p: p, addr: addr, start: time.Now()}
	c, err := p.peer(addr)
	if err != nil {
		f.err = fmt.Errorf("forward to %s: %w", addr, err)
		return f
	}
	f.expire = time.NewTimer(p.conf.Timeout)
	f.c = c.batch.submit(ctx, req)
	return f
}

func (f *forwarding) Wait(stop <-chan struct{}) (*pb.CheckResponse, error) {
	resp, err := f.wait(stop)
	f.p.metrics.forwarded(batched, f.start, err)
	return resp, err
}

func (f *forwarding) wait(stop <-chan struct{}) (*pb.CheckResponse, error) {
	if f.expire != nil {
		defer f.expire.Stop()
	}
	if f.err != nil {
		return nil, f.err
	}
	resp, err := f.c.wait(f.expire.C, stop)
	switch {
	case errors.Is(err, errStopped):
		return nil, fmt.Errorf("forward to %s: %w: %w", f.addr, ErrUnreachable, err)
	case err != nil:
		return nil, wrap(f.c.ctx, "forward", f.addr, err)
	}
	return resp, nil
}

// ForwardNow is Forward without batching: one RPC for this request alone. It
// does not need Run.
func (p *Pool) ForwardNow(ctx context.Context, addr string, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	return p.forwardNow(ctx, addr, &peerpb.ForwardRequest{Requests: []*pb.CheckRequest{req}})
}

// Relay is ForwardNow for a check forwarded to this node whose counter is
// elsewhere (this node is leaving, or its ring gives the key to addr): the
// owner at addr decides it there, never passing it on again, so that two
// nodes whose rings disagree cannot pass a check back and forth.
func (p *Pool) Relay(ctx context.Context, addr string, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	return p.forwardNow(ctx, addr, &peerpb.ForwardRequest{Requests: []*pb.CheckRequest{req}, Relayed: true})
}

// ErrNotHere is Pull's answer when the node asked does not hold the
// counters: it decided nothing.
var ErrNotHere = errors.New("the counters are not here")

// Pull asks the node at addr, the previous owner of req's keys, to decide
// req on the counters it may still hold (its hand-off has not reached
// this node yet). It returns ErrNotHere, wrapped, when that node does not
// hold them all, having decided nothing.
func (p *Pool) Pull(ctx context.Context, addr string, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	resp, err := p.forwardNow(ctx, addr, &peerpb.ForwardRequest{Requests: []*pb.CheckRequest{req}, Pulled: true})
	if status.Code(err) == codes.NotFound {
		return nil, fmt.Errorf("pull from %s: %w", addr, ErrNotHere)
	}
	return resp, err
}

// forwardNow sends fwd, of one request, in an RPC of its own.
func (p *Pool) forwardNow(ctx context.Context, addr string, fwd *peerpb.ForwardRequest) (*pb.CheckResponse, error) {
	start := time.Now()
	resp, err := unary(ctx, p, "forward", addr, peerpb.PeerClient.Forward, fwd)
	if err == nil && len(resp.GetResponses()) != 1 {
		err = fmt.Errorf("forward to %s: peer answered %d responses to 1 request", addr, len(resp.GetResponses()))
	}
	if status.Code(err) == codes.NotFound {
		p.metrics.forwarded(unbatched, start, nil) // a pull that found nothing here: an answer, not a failure
	} else {
		p.metrics.forwarded(unbatched, start, err)
	}
	if err != nil {
		return nil, err
	}
	return resp.GetResponses()[0], nil
}

// AddGlobalHits sends node from's reports of GLOBAL counters to their
// owner at addr.
func (p *Pool) AddGlobalHits(ctx context.Context, addr, from string, reports []*peerpb.GlobalReport) error {
	_, err := unary(ctx, p, "add global hits", addr, peerpb.PeerClient.AddGlobalHits, &peerpb.GlobalHitsRequest{From: from, Reports: reports})
	return err
}

// UpdateGlobals sends owner from's state of GLOBAL keys to the node at
// addr.
func (p *Pool) UpdateGlobals(ctx context.Context, addr, from string, states []*peerpb.GlobalState) error {
	_, err := unary(ctx, p, "update globals", addr, peerpb.PeerClient.UpdateGlobals, &peerpb.GlobalUpdateRequest{From: from, States: states})
	return err
}

// HandOff gives counters that node from no longer owns to their new owner at
// addr, and returns the new owner's refusals: one per counter it did not
// take, naming it by its index in counters, with the reason. Every other
// counter was taken. An answer whose refusals do not name distinct
// counters, or whose accepted count disagrees with them, is an error, as
// is a failed call: then the caller cannot know what was taken.
func (p *Pool) HandOff(ctx context.Context, addr, from string, counters []*peerpb.CounterState) ([]*peerpb.Refusal, error) {
	resp, err := unary(ctx, p, "hand off", addr, peerpb.PeerClient.HandOff, &peerpb.HandOffRequest{From: from, Counters: counters})
	if err != nil {
		return nil, err
	}
	return checkAnswer("hand off", addr, resp, len(counters))
}

// HandOffDone tells the node at addr that node from has handed it every
// counter it held for keys the node owns in the ring whose ID is ring.
func (p *Pool) HandOffDone(ctx context.Context, addr, from string, ring uint64) error {
	_, err := unary(ctx, p, "hand off", addr, peerpb.PeerClient.HandOff, &peerpb.HandOffRequest{From: from, Done: ring})
	return err
}

// HandOffLeft sends the node at addr node from's last word as it shuts
// down (see HandOffRequest.left): it has left, its peer port is closed,
// and it holds no counter for keys the node owns in the ring whose ID is
// ring. An error with gRPC's code FAILED_PRECONDITION says the node did
// not take the word.
func (p *Pool) HandOffLeft(ctx context.Context, addr, from string, ring uint64) error {
	_, err := unary(ctx, p, "hand off", addr, peerpb.PeerClient.HandOff, &peerpb.HandOffRequest{From: from, Done: ring, Left: true})
	return err
}

// Replicate gives copies of counters that node from owns to the node at
// addr, which would own them were from gone, and returns its refusals as
// HandOff does: an answer that does not add up is an error.
func (p *Pool) Replicate(ctx context.Context, addr, from string, counters []*peerpb.CounterState) ([]*peerpb.Refusal, error) {
	resp, err := unary(ctx, p, "replicate", addr, peerpb.PeerClient.Replicate, &peerpb.ReplicateRequest{From: from, Counters: counters})
	if err != nil {
		return nil, err
	}
	return checkAnswer("replicate", addr, resp, len(counters))
}

// answer is a peer's answer about counters sent to it: HandOffResponse or
// ReplicateResponse.
type answer interface {
	GetAccepted() int64
	GetRefused() []*peerpb.Refusal
}

// checkAnswer returns a's refusals of n counters sent by op to addr,
// unless they do not name distinct counters or disagree with a's
// accepted count: then the caller cannot know what was taken.
func checkAnswer(op, addr string, a answer, n int) ([]*peerpb.Refusal, error) {
	refused := a.GetRefused()
	if err := checkRefusals(refused, n); err != nil {
		return nil, fmt.Errorf("%s to %s: peer %w", op, addr, err)
	}
	if want := int64(n - len(refused)); a.GetAccepted() != want {
		return nil, fmt.Errorf("%s to %s: peer accepted %d of %d counters but refused %d", op, addr, a.GetAccepted(), n, len(refused))
	}
	return refused, nil
}

// rpc is a method of peerpb.PeerClient, as a method expression.
type rpc[Req, Resp any] func(peerpb.PeerClient, context.Context, Req, ...grpc.CallOption) (Resp, error)

// unary makes one RPC to addr, bounded by Config.Timeout, and wraps its
// error with op and addr.
func unary[Req, Resp any](ctx context.Context, p *Pool, op, addr string, method rpc[Req, Resp], req Req) (Resp, error) {
	var zero Resp
	c, err := p.peer(addr)
	if err != nil {
		return zero, fmt.Errorf("%s to %s: %w", op, addr, err)
	}
	ctx, cancel := context.WithTimeout(ctx, p.conf.Timeout)
	defer cancel()
	resp, err := method(c.client, ctx, req)
	if err != nil {
		return zero, wrap(ctx, op, addr, err)
	}
	return resp, nil
}

// wrap adds op and addr to err, from a call made with ctx, and marks it
// ErrUnreachable if it means the peer could not be reached in time.
func wrap(ctx context.Context, op, addr string, err error) error {
	if unreachable(ctx, err) {
		return fmt.Errorf("%s to %s: %w: %w", op, addr, ErrUnreachable, err)
	}
	return fmt.Errorf("%s to %s: %w", op, addr, err)
}

func unreachable(ctx context.Context, err error) bool {
	if errors.Is(err, ErrUnreachable) {
		return false // marked already
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	case codes.Canceled:
		// The connection closed under the call (Reset, a retired
		// connection's time up, Close), rather than its caller leaving.
		return ctx.Err() == nil
	}
	return false
}
