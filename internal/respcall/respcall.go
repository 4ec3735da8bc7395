// Package respcall carries the Go client's batches to a node's RESP port
// as RL.CHECK commands (docs/resp.md), one at a time on each of a few
// plain TCP connections, each written and read by the caller's own
// goroutine. A message of a gRPC stream crosses four goroutines on its
// way, the client's and the node's sender and receiver, each often a
// thread to wake; at one to a few callers that hand-over, not the check,
// is most of what a check costs (docs/bench/client.md). A command that
// its caller writes and reads itself, answered by the one goroutine of
// its connection on the node, costs what a Redis call does.
//
// What the port cannot carry is refused (ErrRefused) before anything is
// decided, so that the caller sends that request on the gRPC stream
// instead: no connection is free, none is open yet (they are dialled in
// the background, never by a caller), the node answers that it does not
// serve RL.CHECK, or a connection kept idle was closed by the node
// before it read the command.
package respcall

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ringlimit/ringlimit/internal/rawio"
)

// PortHeader is the header of a node's CheckStream that names the port
// of its RESP listener (api.Config.RESPPort).
const PortHeader = "ringlimit-resp-port"

// ErrRefused is wrapped by the errors of calls that nothing decided:
// send the request another way.
var ErrRefused = errors.New("RESP port refused")

// ErrLost is wrapped by the errors of calls whose connection failed
// after the command was written: the node may have decided it.
var ErrLost = errors.New("RESP connection lost")

// RetryAfter is how long a Pool refuses every call after a dial failed,
// or the node refused RL.CHECK or spoke no RESP: a node of an older
// version, or a port the client cannot reach, is not tried on every call.
const RetryAfter = 5 * time.Second

// MaxPayload is the largest payload a call carries: the RESP port's
// bound of one argument (resp.DefaultLimits' MaxBulk). Larger requests
// go another way.
const MaxPayload = 4 << 10

// MaxAnswer bounds the answer a call reads: a node's answer to a payload
// of MaxPayload bytes is far smaller, and a longer one is refused before
// its bytes are read.
const MaxAnswer = 1 << 20

// keptAnswer is the longest answer buffer a connection keeps.
const keptAnswer = 64 << 10

// dialTimeout bounds a background dial.
const dialTimeout = 2 * time.Second

// Pool is the connections of one client to one RESP port: at most Max,
// each carrying one call at a time. It is safe for concurrent use.
type Pool struct {
	addr string
	max  int
	base context.Context // ends at Close: the dials
	stop context.CancelFunc
	wg   sync.WaitGroup // the dials in progress

	mu      sync.Mutex
	idle    []*conn
	open    int       // connections open or being dialled
	retryAt time.Time // no call before this
	closed  bool
}

// conn is one connection and its buffers.
type conn struct {
	nc     net.Conn
	br     *bufio.Reader // reads from src
	src    source
	out    []byte // the command being written
	answer []byte // the payload of the last answer
	used   bool   // it has carried a call: the node may have closed it idle since
}

// source is what a conn's bufio.Reader reads: its connection, but with a
// command to write first, set by call, written by the read that waits for
// its answer (rawio.WriteRead).
type source struct {
	nc    net.Conn
	first []byte // the command to write before the next read; nil for none
	err   error  // the error of writing first
}

func (s *source) Read(p []byte) (int, error) {
	if s.first == nil {
		return s.nc.Read(p)
	}
	w := s.first
	s.first = nil
	n, werr, rerr := rawio.WriteRead(s.nc, w, p)
	if werr != nil {
		s.err = werr
		return 0, werr
	}
	return n, rerr
}

// New returns a Pool of at most max connections to addr (host:port). It
// dials nothing yet.
func New(addr string, max int) *Pool {
	p := &Pool{addr: addr, max: max}
	p.base, p.stop = context.WithCancel(context.Background())
	return p
}

// Addr is the address the pool dials.
func (p *Pool) Addr() string { return p.addr }

// Call sends RL.CHECK payload and hands the payload of the answer to
// decode, which must not keep it. It returns ctx's error as soon as ctx
// ends (the connection is then closed: the command, if written, is the
// node's to decide). An error wrapping ErrRefused means nothing decided
// the request; one wrapping ErrLost that the node may have.
func (p *Pool) Call(ctx context.Context, payload []byte, decode func(answer []byte) error) error {
	if len(payload) > MaxPayload {
		return fmt.Errorf("%w: payload of %d bytes, over %d", ErrRefused, len(payload), MaxPayload)
	}
	c, err := p.get()
	if err != nil {
		return err
	}
	var stop func() bool
	if ctx.Done() != nil {
		// A caller that gives up wakes the read: the deadline in the past
		// ends it, and the connection, whose next answer is unknown now.
		stop = context.AfterFunc(ctx, func() { c.nc.SetDeadline(time.Unix(1, 0)) })
	}
	err = c.call(payload, decode)
	if stop != nil && !stop() { // ctx ended, and its deadline cut the call or would cut the next
		p.drop(c)
		if err == nil {
			return nil // answered before it gave up
		}
		return ctx.Err()
	}
	var refused *refusal
	if err == nil || errors.As(err, &refused) && refused.keep {
		p.put(c) // answered, or an error answer: the connection reads on
	} else {
		p.drop(c)
	}
	if refused != nil {
		if refused.backOff {
			p.backOff()
		}
		return fmt.Errorf("%w: %s: %s", ErrRefused, p.addr, refused.why)
	}
	return err
}

// refusal is a call that nothing decided: why, whether its connection
// may carry the next call, and whether the port is to be left alone for
// RetryAfter.
type refusal struct {
	why     string
	keep    bool
	backOff bool
}

func (r *refusal) Error() string { return r.why }

// call writes the command of payload on c and reads its answer.
func (c *conn) call(payload []byte, decode func([]byte) error) error {
	c.out = append(c.out[:0], "*2\r\n$8\r\nRL.CHECK\r\n$"...)
	c.out = strconv.AppendInt(c.out, int64(len(payload)), 10)
	c.out = append(c.out, "\r\n"...)
	c.out = append(c.out, payload...)
	c.out = append(c.out, "\r\n"...)
	used := c.used
	c.used = true
	if used && c.br.Buffered() == 0 {
		// The connection has carried a call and its answer, and nothing
		// else is there to read: the command goes with the read of its
		// answer.
		c.src.first, c.src.err = c.out, nil
	} else if _, err := c.nc.Write(c.out); err != nil {
		// A command written in part is not one the node can decide.
		return &refusal{why: "write: " + err.Error()}
	}
	_, err := c.br.Peek(1)
	c.src.first = nil
	if werr := c.src.err; werr != nil {
		c.src.err = nil
		return &refusal{why: "write: " + werr.Error()}
	}
	if err != nil {
		if used && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
			// The node closed the connection, idle, before it read the
			// command: a node answers every command it has read before it
			// closes a connection (resp.Server.Shutdown).
			return &refusal{why: "connection closed by the node while idle"}
		}
		return fmt.Errorf("%w: %v", ErrLost, err)
	}
	answer, errLine, err := readAnswer(c.br, c.answer[:0])
	c.answer = answer
	if cap(c.answer) > keptAnswer {
		c.answer = nil // a rare long answer's buffer is not kept
	}
	switch {
	case err != nil:
		var pe *ProtocolError
		if errors.As(err, &pe) {
			// Not a ringlimit RESP port: nothing there decides checks.
			return &refusal{why: err.Error(), backOff: true}
		}
		return fmt.Errorf("%w: %v", ErrLost, err)
	case errLine != "":
		// The node refused the command whole (an older node does not know
		// it): the stream decides the request, or refuses it, as it does.
		return &refusal{why: errLine, keep: true, backOff: true}
	}
	return decode(answer)
}

// get returns an idle connection, or refuses the call and dials one in
// the background if fewer than max are open.
func (p *Pool) get() (*conn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return nil, fmt.Errorf("%w: closed", ErrRefused)
	case len(p.idle) > 0:
		c := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		return c, nil
	case time.Now().Before(p.retryAt):
		return nil, fmt.Errorf("%w: %s failed less than %v ago", ErrRefused, p.addr, RetryAfter)
	case p.open < p.max:
		p.open++
		p.wg.Go(p.dial)
		return nil, fmt.Errorf("%w: %s: connecting", ErrRefused, p.addr)
	}
	return nil, fmt.Errorf("%w: %s: every connection busy", ErrRefused, p.addr)
}

// dial opens a connection and makes it idle; a failure leaves the port
// alone for RetryAfter.
func (p *Pool) dial() {
	ctx, cancel := context.WithTimeout(p.base, dialTimeout)
	defer cancel()
	nc, err := (&net.Dialer{}).DialContext(ctx, "tcp", p.addr)
	if err != nil {
		p.mu.Lock()
		p.open--
		p.mu.Unlock()
		p.backOff()
		return
	}
	nc = rawio.Wrap(nc) // as the node's end does: no wake of the runtime's monitor thread a call
	c := &conn{nc: nc, src: source{nc: nc}}
	c.br = bufio.NewReaderSize(&c.src, 4<<10)
	p.put(c)
}

// put makes c idle, or closes it if the pool is closed.
func (p *Pool) put(c *conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		p.open--
		c.nc.Close()
		return
	}
	p.idle = append(p.idle, c)
}

// drop closes c, which carries no more calls.
func (p *Pool) drop(c *conn) {
	c.nc.Close()
	p.mu.Lock()
	p.open--
	p.mu.Unlock()
}

// backOff refuses every call for RetryAfter.
func (p *Pool) backOff() {
	p.mu.Lock()
	p.retryAt = time.Now().Add(RetryAfter)
	p.mu.Unlock()
}

// Close closes the idle connections, and the busy ones as their calls
// end, and waits for the dials in progress. Later calls are refused.
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.open -= len(idle)
	p.mu.Unlock()
	p.stop()
	for _, c := range idle {
		c.nc.Close()
	}
	p.wg.Wait()
}
