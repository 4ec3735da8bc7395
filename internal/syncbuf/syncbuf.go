// Package syncbuf is a buffer that goroutines write while another reads
// it: the log destination of tests that read what a node, a process or a
// reloader has logged so far, which a bytes.Buffer alone would race on.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent use. The zero value is
// empty and ready.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Tail returns the last max bytes written, marked as cut when there were
// more: enough of a long log to end a test's message with.
func (b *Buffer) Tail(max int) string {
	s := b.String()
	if len(s) > max {
		return "[...]\n" + s[len(s)-max:]
	}
	return s
}
