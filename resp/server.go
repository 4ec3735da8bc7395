// Package resp serves the Redis protocol (RESP2, and RESP3 after HELLO 3)
// on a port of its own, so that an application in any language can check
// limits with the Redis client it already has: CL.THROTTLE answers as
// redis-cell documents it, decided by the node's ordinary check path (the
// key's owner, GCRA), plus what clients send as they connect (PING,
// HELLO, COMMAND, CLIENT, SELECT 0, QUIT). See docs/resp.md.
//
// A connection is served by one goroutine, which reads a command, decides
// it and answers, in order. Pipelined CL.THROTTLE commands that have
// arrived together are decided as one check request (at most
// checks.MaxItems), which is what makes a pipeline cheap: one pass
// through the service, and one batch to each owner, for many commands.
// What a connection may make the server hold is bounded by Limits, and
// its time by the timeouts of Config.
package resp

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/rawio"
)

// Checker decides checks: the node's service.
type Checker interface {
	Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error)
}

// Config configures a Server. Zero timeouts mean none.
type Config struct {
	// Checker decides every CL.THROTTLE.
	Checker Checker
	// TLS, if not nil, is the server side of TLS on every connection.
	TLS *tls.Config
	// HandshakeTimeout bounds a TLS handshake, and the rest of a command
	// once its first byte has arrived: a client that trickles a command
	// holds its connection that long at most.
	HandshakeTimeout time.Duration
	// IdleTimeout closes a connection that sends no command for that
	// long.
	IdleTimeout time.Duration
	// WriteTimeout closes a connection that does not read its answers
	// within that long.
	WriteTimeout time.Duration
	// RequestTimeout bounds the decision of one batch of commands.
	RequestTimeout time.Duration
	// Limits bound each connection's input; the zero value means
	// DefaultLimits.
	Limits Limits
	// Now is the clock of the instants checks are made at; nil means
	// time.Now. The service deciding them should share it.
	Now func() time.Time
	// Logger receives the server's logs; nil discards them.
	Logger *slog.Logger
	// Native, if not nil, answers RL.CHECK; without it RL.CHECK is
	// refused.
	Native Native
	// Established, if not nil, is called with each connection as it was
	// accepted once its first command has been read whole (after its
	// TLS handshake): a listener that keeps connections apart until they
	// speak (package conns) moves it among those that do.
	Established func(net.Conn)
}

// Server serves RESP connections. Its methods are safe for concurrent
// use; Serve runs until Shutdown.
type Server struct {
	conf Config
	now  func() time.Time
	log  *slog.Logger

	closing atomic.Bool // set once, by Shutdown

	mu       sync.Mutex
	lis      []net.Listener
	conns    map[*conn]struct{}
	handlers sync.WaitGroup
}

// New returns a Server of conf. It starts nothing; Serve does.
func New(conf Config) *Server {
	if conf.Limits == (Limits{}) {
		conf.Limits = DefaultLimits()
	}
	s := &Server{conf: conf, now: conf.Now, log: conf.Logger, conns: map[*conn]struct{}{}}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s
}

// ErrServerClosed is returned by Serve once Shutdown is called.
var ErrServerClosed = errors.New("resp: server closed")

// Serve accepts connections on lis and serves each on a goroutine of its
// own, until Shutdown; it then returns ErrServerClosed. It closes lis.
func (s *Server) Serve(lis net.Listener) error {
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		lis.Close()
		return ErrServerClosed
	}
	s.lis = append(s.lis, lis)
	s.mu.Unlock()
	defer lis.Close()
	for {
		nc, err := lis.Accept()
		if err != nil {
			if s.closing.Load() {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		c := s.track(nc)
		if c == nil {
			return ErrServerClosed
		}
		go func() {
			defer s.handlers.Done()
			defer s.untrack(c)
			c.serve()
		}()
	}
}

// track registers a new connection, or closes it and returns nil once
// the server is closing.
func (s *Server) track(nc net.Conn) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		nc.Close()
		return nil
	}
	c := &conn{s: s, raw: nc, nc: rawio.Wrap(nc)}
	s.conns[c] = struct{}{}
	s.handlers.Add(1)
	return c
}

func (s *Server) untrack(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.raw.Close()
}

// Shutdown stops accepting connections and ends those open: each
// finishes the commands it has read, answers them and is closed. It
// waits for them until ctx ends, then closes those left.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing.Store(true)
	for _, l := range s.lis {
		l.Close()
	}
	for c := range s.conns {
		c.raw.SetReadDeadline(time.Now()) // wakes a read; the handler then sees closing
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.handlers.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		for c := range s.conns {
			c.raw.Close()
		}
		s.mu.Unlock()
		<-done
		return ctx.Err()
	}
}

// conn is one connection and its state: the protocol version, and the
// CL.THROTTLE commands read and not yet decided.
type conn struct {
	s *Server
	// raw is the accepted connection, which Shutdown may wake or close;
	// nc is what the handler reads and writes: raw, or TLS over it. Only
	// the handler's goroutine uses nc.
	raw net.Conn
	nc  net.Conn
	r   *Reader
	w   writer

	batch    []throttle
	nowMs    int64 // when the batch's checks are made
	quit     bool
	readBy   time.Time     // the deadline of the read awaited: the next command, or the rest of one; zero: none
	readFor  time.Duration // the timeout readBy is of
	reads    deadline      // nc's read deadline
	writes   deadline      // nc's write deadline
	writeErr error         // the first write's error; the connection then ends
	spoke    bool          // a command has been read: Config.Established was told

	clientCtx context.Context // names the client to RL.CHECK's checks; nil until the first
}

func (c *conn) serve() {
	conf := c.s.conf
	c.reads.set, c.writes.set = c.nc.SetReadDeadline, c.nc.SetWriteDeadline
	if conf.TLS != nil {
		tc := tls.Server(c.nc, conf.TLS)
		c.reads.move(after(time.Now(), conf.HandshakeTimeout), conf.HandshakeTimeout)
		if err := tc.Handshake(); err != nil {
			c.s.log.Debug("resp: TLS handshake", "remote", c.nc.RemoteAddr(), "err", err)
			return
		}
		c.nc = tc
	}
	c.r = NewReader(timedReader{c}, conf.Limits)
	c.w = writer{bw: bufio.NewWriterSize(timedWriter{c}, conf.Limits.Buffer)}
	// Whatever ends the connection (QUIT, Shutdown, bad input, the
	// client's end), the commands read before it are answered.
	defer func() {
		c.decide()
		c.flush()
	}()
	for !c.quit {
		err := c.next()
		if err == nil {
			continue
		}
		if pe := (*ProtocolError)(nil); errors.As(err, &pe) { // pe escapes: declared here, not per command
			c.decide()
			c.w.fail("ERR " + pe.Error())
			return
		}
		if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, net.ErrClosed) {
			c.s.log.Debug("resp: connection", "remote", c.nc.RemoteAddr(), "err", err)
		}
		return
	}
}

// next reads one command and handles it. When nothing more of the
// pipeline is buffered, it first decides the commands read, answers them
// and waits for the next one, up to IdleTimeout.
func (c *conn) next() error {
	conf := c.s.conf
	if c.writeErr != nil {
		return c.writeErr // a client that does not read its answers
	}
	if c.r.Buffered() == 0 {
		c.decide()
		if err := c.flush(); err != nil {
			return err
		}
		// The deadline is set before closing is read: a Shutdown that
		// begins meanwhile sets its own after it, and wakes the wait.
		c.await(conf.IdleTimeout)
		c.reads.move(c.readBy, c.readFor)
		if c.s.closing.Load() {
			return net.ErrClosed
		}
		if err := c.r.Peek(); err != nil {
			return err
		}
	}
	if c.s.closing.Load() {
		return net.ErrClosed // the commands read so far are answered by serve
	}
	// A command has begun: the rest of it has HandshakeTimeout from here,
	// if it is not in the buffer already (timedReader).
	c.await(conf.HandshakeTimeout)
	args, err := c.r.Next()
	if err != nil {
		return err
	}
	if !c.spoke {
		c.spoke = true
		if f := conf.Established; f != nil {
			f(c.raw)
		}
	}
	c.command(args)
	return nil
}

// after is the deadline d after now, or none (zero) for 0.
func after(now time.Time, d time.Duration) time.Time {
	if d <= 0 {
		return time.Time{}
	}
	return now.Add(d)
}

// deadline is one of a connection's deadlines, moved coarsely: moving it
// is a timer's update in the runtime, which one command at a time paid
// two or three times a command. A deadline in force is kept while it is
// no later than the one wanted, and earlier by at most a tenth of its
// timeout or a second, whichever is less; so a timeout cuts a connection
// that much early at most (docs/resp.md).
type deadline struct {
	set func(time.Time) error
	at  time.Time // the deadline in force; zero: none
}

// move makes t (zero: none), of a timeout of d, the deadline.
func (dl *deadline) move(t time.Time, d time.Duration) {
	if !t.IsZero() && !dl.at.IsZero() && !dl.at.After(t) && t.Sub(dl.at) <= min(d/10, time.Second) {
		return
	}
	if t.IsZero() && dl.at.IsZero() {
		return
	}
	dl.set(t)
	dl.at = t
}

// timedReader is the connection as the Reader reads it: each read waits
// until conn.readBy at most, the deadline of what is awaited. A command
// that arrives whole, as almost all do, is read from the buffer with no
// deadline moved.
type timedReader struct{ c *conn }

func (r timedReader) Read(p []byte) (int, error) {
	c := r.c
	c.reads.move(c.readBy, c.readFor)
	return c.nc.Read(p)
}

// await makes the reads that follow wait d from now at most.
func (c *conn) await(d time.Duration) {
	c.readBy, c.readFor = after(time.Now(), d), d
}

func (c *conn) flush() error {
	if c.w.bw.Buffered() == 0 {
		return nil
	}
	return c.w.bw.Flush()
}

// timedWriter writes a connection's answers, each write within
// WriteTimeout: those the server flushes and those the buffer writes as
// it fills, in a long pipeline. The first error is kept in the conn,
// which then ends.
type timedWriter struct{ c *conn }

func (w timedWriter) Write(p []byte) (int, error) {
	d := w.c.s.conf.WriteTimeout
	w.c.writes.move(after(time.Now(), d), d)
	n, err := w.c.nc.Write(p)
	if err != nil && w.c.writeErr == nil {
		w.c.writeErr = err
	}
	return n, err
}

// throttle adds t to the batch, which is decided when the pipeline read
// so far is, or sooner when it is full.
func (c *conn) throttle(t throttle) {
	if len(c.batch) == 0 {
		c.nowMs = c.s.now().UnixMilli()
	}
	c.batch = append(c.batch, t)
	if len(c.batch) == checks.MaxItems {
		c.decide()
	}
}

// decide decides the batch as one check request and writes the answers,
// in order.
func (c *conn) decide() {
	if len(c.batch) == 0 {
		return
	}
	items := make([]*pb.CheckItem, len(c.batch))
	for i, t := range c.batch {
		items[i] = t.item(c.nowMs)
	}
	ctx := context.Background()
	if d := c.s.conf.RequestTimeout; d > 0 {
		dc := &deadlineCtx{Context: ctx, deadline: time.Now().Add(d)}
		defer dc.stop()
		ctx = dc
	}
	resp, err := c.s.conf.Checker.Check(ctx, &pb.CheckRequest{Requests: items})
	results := resp.GetResponses()
	for i, t := range c.batch {
		switch {
		case err != nil:
			c.w.fail("ERR " + err.Error())
		case i >= len(results) || results[i] == nil:
			c.w.fail("ERR no result") // a service that breaks its contract; never expected
		case results[i].GetError() != "":
			c.w.fail("ERR " + results[i].GetError())
		default:
			a := t.answer(results[i], c.nowMs)
			c.w.array(len(a))
			for _, v := range a {
				c.w.integer(v)
			}
		}
	}
	clear(c.batch)
	c.batch = c.batch[:0]
}

// deadlineCtx is a context with a deadline whose timer is started only
// when something waits for it (Done): deciding a key this node owns reads
// Err at most, and context.WithTimeout's timer, started and stopped for
// every batch, was a few percent of the CPU of one command at a time.
// It is safe for concurrent use, as a context must be.
type deadlineCtx struct {
	context.Context // never done; it may carry values (the client)
	deadline        time.Time
	mu              sync.Mutex
	err             error           // until timed is made: why c is done, once it is
	timed           context.Context // made by the first Done
	cancel          context.CancelFunc
}

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *deadlineCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timed == nil {
		err := c.errLocked()
		c.timed, c.cancel = context.WithDeadline(c.Context, c.deadline)
		if err == context.Canceled {
			c.cancel()
		}
	}
	return c.timed.Done()
}

func (c *deadlineCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errLocked()
}

func (c *deadlineCtx) errLocked() error {
	switch {
	case c.timed != nil:
		return c.timed.Err()
	case c.err == nil && !time.Now().Before(c.deadline):
		c.err = context.DeadlineExceeded
	}
	return c.err
}

// stop ends c, as a CancelFunc does, once its batch is decided.
func (c *deadlineCtx) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timed != nil {
		c.cancel()
	} else if c.errLocked() == nil {
		c.err = context.Canceled
	}
}
