package respcall

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"slices"
)

// ProtocolError is an answer that is not RESP, or not one RL.CHECK has:
// the port is not a ringlimit node's RESP port.
type ProtocolError struct{ Reason string }

func (e *ProtocolError) Error() string { return "not a RESP answer: " + e.Reason }

// maxErrorLine bounds an error answer's line.
const maxErrorLine = 1 << 10

// readAnswer reads one answer to RL.CHECK from br: a bulk string, whose
// payload it appends to buf and returns, or an error line, which it
// returns as errLine. Whatever else arrives is a ProtocolError, and so is
// a length over MaxAnswer, refused before its bytes are read: a port
// that is not a node's (or a node that lies) makes the client hold no
// more than MaxAnswer bytes. A connection that ends within an answer is
// io.ErrUnexpectedEOF.
func readAnswer(br *bufio.Reader, buf []byte) (payload []byte, errLine string, err error) {
	kind, err := br.ReadByte()
	if err != nil {
		return buf, "", err
	}
	switch kind {
	case '$':
	case '-':
		line, err := readLine(br, maxErrorLine)
		if err != nil {
			return buf, "", err
		}
		return buf, string(line), nil
	default:
		return buf, "", &ProtocolError{fmt.Sprintf("answer begins with %q", kind)}
	}
	line, err := readLine(br, 16)
	if err != nil {
		return buf, "", err
	}
	n := 0
	for _, b := range line {
		if b < '0' || b > '9' || n > MaxAnswer {
			return buf, "", &ProtocolError{fmt.Sprintf("bulk length %.16q, want 0 to %d", line, MaxAnswer)}
		}
		n = n*10 + int(b-'0')
	}
	if len(line) == 0 || n > MaxAnswer {
		return buf, "", &ProtocolError{fmt.Sprintf("bulk length %.16q, want 0 to %d", line, MaxAnswer)}
	}
	start := len(buf)
	buf = slices.Grow(buf, n+2)[:start+n+2]
	if _, err := io.ReadFull(br, buf[start:]); err != nil {
		return buf[:start], "", noEOF(err)
	}
	if buf[start+n] != '\r' || buf[start+n+1] != '\n' {
		return buf[:start], "", &ProtocolError{"bulk string does not end in CRLF"}
	}
	return buf[:start+n], "", nil
}

// readLine reads a line ending in CRLF of at most max bytes, without its
// CRLF; the line is br's and valid until its next read.
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull) || len(line) > max+2:
		return nil, &ProtocolError{fmt.Sprintf("line longer than %d bytes", max)}
	case err != nil:
		return nil, noEOF(err)
	case len(line) < 2 || line[len(line)-2] != '\r':
		return nil, &ProtocolError{"line does not end in CRLF"}
	}
	return line[:len(line)-2], nil
}

// noEOF is err, but io.ErrUnexpectedEOF for io.EOF: the connection ended
// within an answer.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
