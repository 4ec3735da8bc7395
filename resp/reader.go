package resp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/ringlimit/ringlimit/internal/nodeport"
)

// Limits bound what one connection may make the server hold. Every bound
// is checked before the bytes it guards are read or allocated, so a
// header announcing 512 MB costs nothing but its own few bytes.
type Limits struct {
	// MaxArgs bounds the elements of one command's array (its name
	// included).
	MaxArgs int
	// MaxBulk bounds the bytes of one argument (a bulk string).
	MaxBulk int
	// MaxCommand bounds the bytes of one command's arguments together.
	MaxCommand int
	// MaxInline bounds the bytes of one inline command (a line typed by
	// hand, as telnet sends it).
	MaxInline int
	// Buffer is the bytes read ahead from the connection: the most of a
	// pipeline that is held before it is answered. It bounds every header
	// line and inline command too, so it is at least MaxInline.
	Buffer int
}

// DefaultLimits fit CL.THROTTLE with the longest key a check takes
// (limiter.MaxKeyLen, 1 KiB) many times over, and what clients send as
// they connect (HELLO, CLIENT SETINFO), with room to spare: one
// connection holds at most Buffer + MaxCommand bytes of input.
func DefaultLimits() Limits {
	return Limits{MaxArgs: 32, MaxBulk: 4 << 10, MaxCommand: 16 << 10, MaxInline: 16 << 10, Buffer: 16 << 10}
}

// ProtocolError is input that is not RESP or breaks a bound of Limits.
// The server answers it with an error and closes the connection, as
// Redis does: after it, where the next command begins is unknown.
type ProtocolError struct{ Reason string }

func (e *ProtocolError) Error() string { return "Protocol error: " + e.Reason }

// Reader decodes commands from a connection: arrays of bulk strings, as
// clients send them, or inline commands. It is not safe for concurrent
// use.
type Reader struct {
	br    *bufio.Reader
	lim   Limits
	arena []byte // the current command's arguments, back to back
	ends  []int  // where each argument ends in arena
	args  [][]byte
}

// NewReader returns a Reader of r within lim.
func NewReader(r io.Reader, lim Limits) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, max(lim.Buffer, lim.MaxInline, 16)), lim: lim}
}

// Buffered returns the bytes read from the connection and not decoded
// yet: more of a pipeline.
func (r *Reader) Buffered() int { return r.br.Buffered() }

// Peek waits for the next byte, without decoding it: a command has begun.
func (r *Reader) Peek() error {
	_, err := r.br.Peek(1)
	return err
}

// Next returns the next command's arguments, the command's name first;
// they are valid until the next call. An inline line of blanks is no
// command and is skipped. The error is a *ProtocolError for bad input, or
// the connection's.
func (r *Reader) Next() ([][]byte, error) {
	for {
		b, err := r.br.Peek(1)
		if err != nil {
			return nil, err
		}
		r.arena, r.ends = r.arena[:0], r.ends[:0]
		if b[0] == '*' {
			err = r.readArray()
		} else {
			err = r.readInline()
		}
		if err != nil {
			return nil, err
		}
		if len(r.ends) > 0 {
			return r.slices(), nil
		}
	}
}

// slices cuts the arena into the arguments: only once the command is
// whole, since the arena may move as it grows.
func (r *Reader) slices() [][]byte {
	r.args = r.args[:0]
	start := 0
	for _, end := range r.ends {
		r.args = append(r.args, r.arena[start:end:end])
		start = end
	}
	return r.args
}

// line returns the next line without its CRLF, as long as the buffer
// at most; what refers to it is valid until the next read.
func (r *Reader) line(what string) ([]byte, error) {
	line, err := r.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return nil, &ProtocolError{fmt.Sprintf("%s longer than %d bytes", what, r.br.Size())}
	}
	if err != nil {
		return nil, noEOF(err)
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, &ProtocolError{what + " does not end in CRLF"}
	}
	return line[:len(line)-2], nil
}

func (r *Reader) readArray() error {
	line, err := r.line("array header")
	if err != nil {
		return err
	}
	n, err := header(line, '*', "array length", r.lim.MaxArgs)
	if err != nil {
		return err
	}
	for range n {
		if err := r.readBulk(); err != nil {
			return err
		}
	}
	return nil
}

func (r *Reader) readBulk() error {
	line, err := r.line("bulk header")
	if err != nil {
		return err
	}
	if len(line) == 0 || line[0] != '$' {
		return &ProtocolError{fmt.Sprintf("expected '$', got %q", firstByte(line))}
	}
	n, err := header(line, '$', "bulk length", r.lim.MaxBulk)
	if err != nil {
		return err
	}
	if len(r.arena)+n > r.lim.MaxCommand {
		return &ProtocolError{fmt.Sprintf("command longer than %d bytes", r.lim.MaxCommand)}
	}
	start := len(r.arena)
	r.arena = slices.Grow(r.arena, n+2)[:start+n+2]
	if _, err := io.ReadFull(r.br, r.arena[start:]); err != nil {
		return noEOF(err)
	}
	if r.arena[start+n] != '\r' || r.arena[start+n+1] != '\n' {
		return &ProtocolError{"bulk string does not end in CRLF"}
	}
	r.arena = r.arena[:start+n]
	r.ends = append(r.ends, len(r.arena))
	return nil
}

// readInline reads a command typed as a line of words separated by
// blanks. (Redis also takes quoted words here; nothing that limits needs
// them, so a quote is an ordinary byte.)
func (r *Reader) readInline() error {
	line, err := r.br.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull) || len(line) > r.lim.MaxInline:
		return &ProtocolError{fmt.Sprintf("inline command longer than %d bytes", min(r.lim.MaxInline, r.br.Size()))}
	case err != nil:
		return noEOF(err)
	case isHTTP(line):
		return &ProtocolError{errHTTP}
	}
	for _, w := range bytes.Fields(line) {
		if len(r.ends) == r.lim.MaxArgs {
			return &ProtocolError{fmt.Sprintf("inline command has more than %d arguments", r.lim.MaxArgs)}
		}
		if len(w) > r.lim.MaxBulk {
			return &ProtocolError{fmt.Sprintf("inline argument longer than %d bytes", r.lim.MaxBulk)}
		}
		r.arena = append(r.arena, w...)
		r.ends = append(r.ends, len(r.arena))
	}
	return nil
}

// errHTTP is the reason of the error that answers an HTTP request (or
// gRPC's HTTP/2 preface) before the connection is closed: a client given
// this port instead of the HTTP or gRPC one learns which it reached, and
// a web page that posts a form here runs nothing its body holds.
const errHTTP = "this is the RESP (Redis protocol) port of a ringlimit node, not HTTP: " +
	"HTTP is served on its --http-addr (default " + nodeport.DefaultHTTPAddr + "), gRPC on its --grpc-addr (default " + nodeport.DefaultGRPCAddr + ")"

// isHTTP reports whether line, an inline command, is an HTTP request line:
// a method in capitals, a target and a version, such as "POST /v1/check
// HTTP/1.1", or "PRI * HTTP/2.0", the HTTP/2 preface a gRPC client
// begins with. No Redis command has that shape.
func isHTTP(line []byte) bool {
	f := bytes.Fields(line)
	if len(f) != 3 || !bytes.HasPrefix(f[2], []byte("HTTP/")) || len(f[0]) > 16 {
		return false
	}
	for _, c := range f[0] {
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}

// header parses the length after kind in a header line: from 0 (or -1,
// a null, which no command carries) to bound.
func header(line []byte, kind byte, what string, bound int) (int, error) {
	if len(line) < 2 || line[0] != kind {
		return 0, &ProtocolError{"invalid " + what}
	}
	digits := line[1:]
	if len(digits) > 10 {
		return 0, &ProtocolError{fmt.Sprintf("%s %.20s is more than %d", what, digits, bound)}
	}
	n := 0
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, &ProtocolError{fmt.Sprintf("invalid %s %q", what, digits)}
		}
		n = n*10 + int(c-'0')
	}
	if n > bound {
		return 0, &ProtocolError{fmt.Sprintf("%s %d is more than %d", what, n, bound)}
	}
	return n, nil
}

func firstByte(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return string(b[:1])
}

// noEOF turns an end of input inside a command into io.ErrUnexpectedEOF,
// so that only a connection closed between commands ends cleanly.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
