package mux

import (
	"context"
	"errors"
	"io"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Workers is how many requests of one stream Serve decides at once. The
// senders in this module keep at most 4 in flight to one node; a stream
// that has Workers requests being decided is not read further until one
// is answered, so that a sender that does not wait costs the node at most
// Workers+1 decoded requests.
const Workers = 4

// Handler answers one request of a stream. ctx ends with the stream, or
// when the request's timeout has passed. A handler that waits (on
// another node, say) lets the stream's next requests through as soon as
// its wait watches ctx, as every wait of a request must (see Serve); one
// that waits on something that cannot watch ctx, such as a lock, calls
// Detach(ctx) first. The answer must carry the request's id.
type Handler[Req, Resp any] func(ctx context.Context, req *Req) *Resp

// Server serves streams of one method. Timeout, Handle and Notice are
// required; the zero value is otherwise ready. It is safe for concurrent
// use.
type Server[Req, Resp any] struct {
	// Timeout reads a request's timeout: 0 for none.
	Timeout func(*Req) time.Duration
	// Handle answers each request.
	Handle Handler[Req, Resp]
	// Notice returns the message that asks a client to end its stream
	// (see Drain and IdleTimeout): id 0, which no request has, and reason
	// as its status.
	Notice func(reason error) *Resp

	// SendTimeout, if positive, is how long an answer may wait to be
	// sent. gRPC's flow control blocks a send while the client does not
	// read its answers, and such a stream would hold its slot (and its
	// goroutines) for as long as its client likes: once an answer has
	// waited SendTimeout, Serve ends the stream (ErrNotRead). Only a
	// stream whose RPC context came through Stoppable can be ended while
	// a send is blocked; others end when the send does.
	SendTimeout time.Duration
	// IdleTimeout, if positive, is how long a stream may go without a
	// request while none is being decided: then it is ended (ErrIdle; as
	// for SendTimeout, through Stoppable), and so gives its slot back.
	// Halfway, its client is asked to end it (Notice, with ErrIdle), as a
	// draining node asks, so that no request crossing the notice is lost.
	// A Client of this package ends the stream at once, and sends its
	// next requests another way for RetryAfter, then on a new stream.
	IdleTimeout time.Duration
	// Ended, if not nil, is called with the stream's context when Serve
	// ends a stream for ErrNotRead or ErrIdle, e.g. to count it, or to
	// close the connection of a client that reads nothing: the ended
	// stream's unsent answers wait there until the client reads them or
	// the connection closes.
	Ended func(ctx context.Context, reason error)

	drainOnce sync.Once
	drainCtx  context.Context // ends at Drain
	drain     context.CancelFunc
	initOnce  sync.Once
}

func (sr *Server[Req, Resp]) init() {
	sr.initOnce.Do(func() { sr.drainCtx, sr.drain = context.WithCancel(context.Background()) })
}

// ErrDrained, ErrIdle and ErrNotRead say why a stream is asked to end
// (the first two, in a Notice) or ended (the last two: Serve returns
// them, and EndedTrailer carries their message).
var (
	ErrDrained = status.Error(codes.Unavailable, "node stopping: end the stream")
	ErrIdle    = status.Error(codes.Unavailable, "stream idle: end it, and open another when there are requests to send")
	ErrNotRead = status.Error(codes.ResourceExhausted, "stream closed: its answers were not read")
)

type stopKey struct{}

// EndedTrailer is the trailer that says why Serve ended a stream: the
// status its client sees is gRPC's, DEADLINE_EXCEEDED, as for any RPC
// whose context ended (see Stoppable).
const EndedTrailer = "ringlimit-stream-ended"

// Stoppable returns a context, derived from ctx, that Serve can end: a
// grpc.InTapHandle returns it for the stream's RPC, so that it becomes
// the context of the RPC's transport stream, whose sends and receives
// watch it. Ending it is how Serve ends a stream whose send is blocked
// (see Server.SendTimeout), or whose receive waits (IdleTimeout): the
// handler alone cannot, as either waits for the client or the context,
// not for the handler. gRPC then ends the RPC with the context's error,
// which reads DEADLINE_EXCEEDED, the nearest of the two it knows (a
// stream ended so is not one its client cancelled).
func Stoppable(ctx context.Context) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	return &stoppable{Context: ctx, cancel: cancel}
}

type stoppable struct {
	context.Context
	cancel  context.CancelFunc
	stopped atomic.Bool
}

func (c *stoppable) stop() {
	c.stopped.Store(true)
	c.cancel()
}

func (c *stoppable) Err() error {
	err := c.Context.Err()
	if err != nil && c.stopped.Load() {
		return context.DeadlineExceeded
	}
	return err
}

func (c *stoppable) Value(key any) any {
	if key == (stopKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// Drain asks the clients of every stream, open or opened later, to end
// it: each gets a Notice, and Serve answers what it has received until the
// client ends the stream. A node does so as it stops, before
// grpc.Server.GracefulStop, which waits for every stream to end. A client
// of this package sends its later requests another way.
func (sr *Server[Req, Resp]) Drain() {
	sr.init()
	sr.drain()
}

// Serve answers the requests of s, up to Workers at once, in any order,
// until the client ends the stream (Serve then returns nil, once every
// request read has been answered) or the stream fails (Serve returns its
// error).
//
// The goroutine that receives a request decides it, rather than hand it
// to another: a hand-over between goroutines costs a node that is not
// busy more than deciding a small request does (the runtime wakes a
// thread for it, which then sleeps again; a timer to watch for slow
// requests costs as much). A request that is about to wait hands the
// receiving over instead: another goroutine takes it, up to Workers
// deciding at once, and the one that handed it over ends once it has
// answered. So a request that waits holds up the stream's next ones only
// until it starts to wait, and one that does not costs no hand-over.
//
// Nothing has to remember to hand over: the handler's context does it.
// Whatever waits on a context asks it for Done first (a select on
// ctx.Done(), a gRPC call, a context derived from it, a wait of package
// batch), and the Done of a request's context hands the receiving over
// before it returns the channel. A request decided without waiting never
// asks, and pays nothing for the rule. Only a wait that cannot watch the
// context, a lock held by a goroutine that itself waits on another node,
// must call Detach first (handoff.Node.Hold does); every other wait of a
// request must watch its context anyway, to end with the request.
//
// A stream that does not read its answers, or sends no requests, is ended
// as Server.SendTimeout and Server.IdleTimeout say.
func (sr *Server[Req, Resp]) Serve(s grpc.BidiStreamingServer[Req, Resp]) error {
	sr.init()
	ctx, cancel := context.WithCancel(s.Context())
	defer cancel()
	sv := &server[Req, Resp]{s: s, ctx: ctx, cancel: cancel, timeout: sr.Timeout, handle: sr.Handle, ended: sr.Ended}
	sv.handOverFn = sv.handOver
	sv.active.Store(1)
	sv.lastRecv.Store(time.Now().UnixNano())
	noticed := make(chan struct{})
	stopNotice := context.AfterFunc(sr.drainCtx, func() {
		defer close(noticed)
		sv.send(sr.Notice(ErrDrained))
	})
	watched := make(chan struct{})
	quit := make(chan struct{})
	if sr.SendTimeout > 0 || sr.IdleTimeout > 0 {
		go func() {
			defer close(watched)
			sr.watch(sv, quit)
		}()
	} else {
		close(watched)
	}
	sv.receive()
	sv.wg.Wait()
	close(quit)
	<-watched
	if !stopNotice() && sr.drainCtx.Err() != nil {
		<-noticed // no Send after Serve returns
	}
	if sv.stopped != nil {
		return sv.stopped
	}
	return sv.err
}

// watch ends sv, as SendTimeout and IdleTimeout say, until quit is closed.
// It looks at a send in progress every quarter of SendTimeout, so a
// stream whose answers are not read is ended at most a quarter of
// SendTimeout late; an idle stream is asked to end, and ended, at the
// instants IdleTimeout says (looked at every quarter of it while a
// request is being decided or answered).
func (sr *Server[Req, Resp]) watch(sv *server[Req, Resp], quit <-chan struct{}) {
	t := time.NewTimer(time.Hour) // reset below, before each wait
	defer t.Stop()
	noticed := false
	for {
		now := time.Now().UnixNano()
		sending := sv.sendingSince.Load()
		if sr.SendTimeout > 0 && sending != 0 && now-sending > int64(sr.SendTimeout) {
			sv.stop(ErrNotRead)
			return
		}
		wait := time.Duration(math.MaxInt64)
		if sr.SendTimeout > 0 {
			wait = sr.SendTimeout / 4
		}
		if sr.IdleTimeout > 0 {
			idle := time.Duration(now - sv.lastRecv.Load())
			switch {
			case sending != 0 || sv.deciding.Load() > 0:
				wait = min(wait, sr.IdleTimeout/4) // not idle: look again
			case idle >= sr.IdleTimeout:
				sv.stop(ErrIdle)
				return
			case !noticed && idle >= sr.IdleTimeout/2:
				noticed = true
				if !sr.notice(sv) {
					return
				}
				continue
			case noticed:
				wait = min(wait, sr.IdleTimeout-idle)
			default:
				wait = min(wait, sr.IdleTimeout/2-idle)
			}
		}
		t.Reset(wait)
		select {
		case <-quit:
			return
		case <-t.C:
		}
	}
}

// notice asks the client of the idle stream sv to end it, and reports
// whether the stream goes on: the notice is sent by watch's goroutine,
// which meanwhile watches nothing else, so a send blocked longer than
// SendTimeout ends the stream all the same.
func (sr *Server[Req, Resp]) notice(sv *server[Req, Resp]) bool {
	var stop *time.Timer
	if sr.SendTimeout > 0 {
		stop = time.AfterFunc(sr.SendTimeout, func() { sv.stop(ErrNotRead) })
	}
	sv.send(sr.Notice(ErrIdle))
	if stop != nil && !stop.Stop() {
		sv.stop(ErrNotRead) // the timer's, done once this returns
		return false
	}
	return true
}

// server is one stream being served.
type server[Req, Resp any] struct {
	s          grpc.BidiStreamingServer[Req, Resp]
	ctx        context.Context // ends with the stream, or when an answer cannot be sent
	cancel     context.CancelFunc
	timeout    func(*Req) time.Duration
	handle     Handler[Req, Resp]
	handOverFn func(*atomic.Bool) // sv.handOver, bound once

	sendMu sync.Mutex     // one Send at a time
	wg     sync.WaitGroup // receivers started by hand-overs
	active atomic.Int32   // goroutines receiving or deciding
	err    error          // why receiving ended; written once, by the last receiver, before wg is done

	// What watch reads: the Unix ns at which the Send in progress began (0
	// while none is), at which the last request was received, and the
	// requests received and not yet answered.
	sendingSince atomic.Int64
	lastRecv     atomic.Int64
	deciding     atomic.Int32
	stopOnce     sync.Once
	stopped      error                                   // why watch ended the stream; written once, by stop, before watch returns
	ended        func(ctx context.Context, reason error) // Server.Ended
}

// End ends the stream s for reason, as Serve ends one whose answers are
// not read or that stays idle: the trailer EndedTrailer says why, and the
// RPC's context ends if Stoppable made it, so that a Send or Recv blocked
// on the client returns (gRPC then ends the RPC DEADLINE_EXCEEDED). It
// reports whether the context could be ended; without Stoppable, only
// the handler's return ends the RPC. A server of another protocol whose
// handler sends (Envoy's quota streams) ends its streams so.
func End(s grpc.ServerStream, reason error) bool {
	s.SetTrailer(metadata.Pairs(EndedTrailer, status.Convert(reason).Message()))
	c, ok := s.Context().Value(stopKey{}).(*stoppable)
	if ok {
		c.stop()
	}
	return ok
}

// stop ends the stream for err, which Serve returns (see End), and the
// requests' contexts.
func (sv *server[Req, Resp]) stop(err error) {
	sv.stopOnce.Do(func() {
		sv.stopped = err
		End(sv.s, err)
		sv.cancel()
		if sv.ended != nil {
			sv.ended(sv.s.Context(), err)
		}
	})
}

// turn is one request being decided by the goroutine that received it:
// the context its handler gets, the request's own, whose Done detaches.
type turn struct {
	context.Context
	// handed is taken once: by Done or Detach, when another goroutine
	// takes over receiving, or by the receiver once it has answered and
	// goes on.
	handed   atomic.Bool
	handOver func(*atomic.Bool)
}

type turnKey struct{}

// Done hands the receiving of the stream's next requests over, if it has
// not yet, and returns the request's Done: whoever asks for it is about
// to wait on it, or to derive a context that will.
func (t *turn) Done() <-chan struct{} {
	t.detach()
	return t.Context.Done()
}

// Value finds t itself for Detach, in t and in the contexts derived from
// it.
func (t *turn) Value(key any) any {
	if key == (turnKey{}) {
		return t
	}
	return t.Context.Value(key)
}

func (t *turn) detach() {
	if !t.handed.Load() {
		t.handOver(&t.handed)
	}
}

// Detach tells the stream that its request of ctx is about to wait on
// something that does not watch ctx, such as a lock: the goroutine
// deciding it stops receiving the stream's next requests, which another
// goroutine takes over (unless Workers are deciding already). A wait that
// watches ctx needs no Detach (see Serve). Detach does nothing for a
// context that is not a stream request's, or that detached already, so
// that code shared with other callers may call it.
func Detach(ctx context.Context) {
	if t, ok := ctx.Value(turnKey{}).(*turn); ok {
		t.detach()
	}
}

// receive receives and decides requests until receiving ends, or until a
// request it decides detaches.
func (sv *server[Req, Resp]) receive() {
	defer sv.active.Add(-1)
	for {
		req, err := sv.s.Recv()
		if err == nil {
			sv.lastRecv.Store(time.Now().UnixNano())
			sv.deciding.Add(1)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				sv.err = err
				sv.cancel()
			}
			return
		}
		if !sv.answer(req) {
			return // another goroutine receives now
		}
	}
}

// handOver starts another receiver, unless handed is taken already (the
// request was answered, or detached before) or Workers goroutines are
// busy.
func (sv *server[Req, Resp]) handOver(handed *atomic.Bool) {
	for {
		n := sv.active.Load()
		if n >= Workers {
			return
		}
		if sv.active.CompareAndSwap(n, n+1) {
			break
		}
	}
	if !handed.CompareAndSwap(false, true) {
		sv.active.Add(-1)
		return
	}
	sv.wg.Go(sv.receive)
}

// answer decides req and sends its answer, and reports whether this
// goroutine still receives: it does unless req detached.
func (sv *server[Req, Resp]) answer(req *Req) (receiving bool) {
	t := &turn{Context: sv.ctx, handOver: sv.handOverFn}
	if d := sv.timeout(req); d > 0 {
		var cancel context.CancelFunc
		t.Context, cancel = context.WithTimeout(sv.ctx, d)
		defer cancel()
	}
	sv.send(sv.handle(t, req))
	sv.deciding.Add(-1)
	return t.handed.CompareAndSwap(false, true)
}

// send sends resp on the stream.
func (sv *server[Req, Resp]) send(resp *Resp) {
	sv.sendMu.Lock()
	sv.sendingSince.Store(time.Now().UnixNano())
	err := sv.s.Send(resp)
	sv.sendingSince.Store(0)
	sv.sendMu.Unlock()
	if err != nil {
		sv.cancel() // the stream is broken
	}
}

// Status encodes err's gRPC status, for a response's status field: how a
// request refused whole says why. It is empty for a nil err. A message
// that is not UTF-8, which protobuf does not encode, is made so.
func Status(err error) []byte {
	if err == nil {
		return nil
	}
	st := status.Convert(err).Proto()
	b, merr := proto.Marshal(st)
	if merr != nil {
		b, _ = proto.Marshal(&spb.Status{Code: st.GetCode(), Message: strings.ToValidUTF8(st.GetMessage(), "\uFFFD")})
	}
	return b
}

// Err decodes a response's status field: nil when it is empty, else the
// error it holds. A status that does not decode, or says OK, is an
// INTERNAL error: a refusal must say why.
func Err(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	st := &spb.Status{}
	if err := proto.Unmarshal(b, st); err != nil {
		return status.Errorf(codes.Internal, "a response's status does not decode: %v", err)
	}
	if st.GetCode() == int32(codes.OK) {
		return status.Error(codes.Internal, "a response refused with status OK")
	}
	return status.ErrorProto(st)
}
