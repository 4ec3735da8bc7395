package resp

import (
	"bufio"
	"strconv"
)

// writer encodes replies into a connection's buffer; the server flushes
// it when no more of the pipeline is buffered. The replies of this server
// are the same in RESP2 and RESP3 but for HELLO's map.
type writer struct {
	bw      *bufio.Writer
	resp3   bool
	scratch [24]byte
}

func (w *writer) line(kind byte, s string) {
	w.bw.WriteByte(kind)
	w.bw.WriteString(s)
	w.bw.WriteString("\r\n")
}

func (w *writer) number(kind byte, n int64) {
	b := append(w.scratch[:0], kind)
	b = strconv.AppendInt(b, n, 10)
	w.bw.Write(append(b, '\r', '\n'))
}

func (w *writer) simple(s string) { w.line('+', s) }
func (w *writer) integer(n int64) { w.number(':', n) }
func (w *writer) array(n int)     { w.number('*', int64(n)) }

// fail writes an error reply. A reply is one line, so any CR or LF in
// msg (an echoed argument) becomes a blank.
func (w *writer) fail(msg string) {
	w.bw.WriteByte('-')
	for i := range len(msg) {
		c := msg[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		w.bw.WriteByte(c)
	}
	w.bw.WriteString("\r\n")
}

func (w *writer) bulk(s []byte) {
	w.number('$', int64(len(s)))
	w.bw.Write(s)
	w.bw.WriteString("\r\n")
}

// mapOf writes the header of a map of n pairs: a map in RESP3, a flat
// array of keys and values in RESP2.
func (w *writer) mapOf(n int) {
	if w.resp3 {
		w.number('%', int64(n))
		return
	}
	w.array(2 * n)
}
