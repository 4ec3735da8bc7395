// Package rawio reads and writes sockets with raw system calls, for the
// connections that carry one small command and its answer at a time:
// the RESP port's (package resp) and the Go client's to it (package
// respcall). See rawConn.
package rawio

import (
	"io"
	"net"
	"syscall"
	"unsafe"
)

// rawConn reads and writes a socket with raw system calls (RawSyscall),
// waiting for it through the runtime's network poller as net.Conn does,
// deadlines included. The difference is the runtime's bookkeeping around
// a system call: entersyscall wakes the runtime's monitor thread (sysmon)
// whenever it sleeps, which it does whenever the process has nothing to
// run, so one command at a time woke it two or three times a command and
// cost the node about a fifth of its CPU (profiled: futex, nanosleep and
// sched_yield in runtime.sysmon). A non-blocking read or write of a socket
// returns at once, EAGAIN when it would block, so it needs none of that.
//
// A rawConn is not safe for concurrent Reads, nor for concurrent Writes;
// a Read and a Write may run at once. Each keeps its state in the
// connection, and hands the poller a function made once, so that a call
// allocates nothing.
type rawConn struct {
	net.Conn // deadlines, addresses, Close
	rc       syscall.RawConn
	r, w     *rawOp
}

// rawOp is one direction's state: the buffer of the call in progress and
// what the system calls made of it.
type rawOp struct {
	p     []byte
	done  int // bytes read or written
	errno syscall.Errno
	fn    func(fd uintptr) bool // the method read or write of this rawOp

	// The read side's state of WriteRead: the command to write before
	// the read, how, and whether that failed; fnFirst is the method
	// writeThenRead.
	first   []byte
	send    func([]byte) (int, error)
	sendErr error
	fnFirst func(fd uintptr) bool
}

// Wrap returns nc reading and writing through rawConn when it is a
// socket, or nc itself.
func Wrap(nc net.Conn) net.Conn {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nc
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nc
	}
	r, w := &rawOp{}, &rawOp{}
	r.fn, w.fn = r.read, w.write
	c := rawConn{Conn: nc, rc: rc, r: r, w: w}
	r.fnFirst, r.send = r.writeThenRead, c.Write
	return c
}

// read makes one read(2) into o.p; false (wait, then call again) when
// nothing is there yet.
func (o *rawOp) read(fd uintptr) bool {
	for {
		n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&o.p[0])), uintptr(len(o.p)))
		switch errno {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		if errno != 0 {
			n = 0 // read(2) returns -1 with its errno: no bytes, not a count
		}
		o.done, o.errno = int(n), errno
		return true
	}
}

// write writes o.p whole with write(2); false (wait, then call again)
// when the socket's buffer is full.
func (o *rawOp) write(fd uintptr) bool {
	for o.done < len(o.p) {
		n, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&o.p[o.done])), uintptr(len(o.p)-o.done))
		switch errno {
		case 0:
			o.done += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			o.errno = errno
			return true
		}
	}
	return true
}

// writeThenRead writes o.first, the first time it is called, and then
// waits for the answer without looking for it: the runtime's poller,
// prepared before this call, wakes the read once it is there. Later calls
// read as read does.
func (o *rawOp) writeThenRead(fd uintptr) bool {
	if o.first == nil {
		return o.read(fd)
	}
	out := o.first
	o.first = nil
	if _, err := o.send(out); err != nil {
		o.sendErr = err
		return true
	}
	return false
}

// do runs o's system calls over p, through f (the RawConn's Read or
// Write) calling fn, and returns the bytes done and the error.
func (c rawConn) do(o *rawOp, f func(func(uintptr) bool) error, fn func(uintptr) bool, op string, p []byte) (int, error) {
	o.p, o.done, o.errno = p, 0, 0
	err := f(fn)
	n, errno := o.done, o.errno
	o.p = nil // the caller's buffer is not kept
	switch {
	case err != nil:
		return n, err
	case errno != 0:
		return n, &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: errno}
	}
	return n, nil
}

func (c rawConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, err := c.do(c.r, c.rc.Read, c.r.fn, "read", p)
	if err == nil && n == 0 {
		return 0, io.EOF
	}
	return n, err
}

func (c rawConn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	return c.do(c.w, c.rc.Write, c.w.fn, "write", p)
}

// writeRead is WriteRead of a rawConn: the write goes from within the
// read, after the runtime's poller is prepared for it, so that nothing
// reads before the answer can be there.
func (c rawConn) writeRead(w, r []byte) (n int, werr, rerr error) {
	if len(r) == 0 {
		return 0, nil, nil
	}
	c.r.first, c.r.sendErr = w, nil
	n, rerr = c.do(c.r, c.rc.Read, c.r.fnFirst, "read", r)
	unsent := c.r.first != nil // the read failed before it began (a closed connection)
	werr, c.r.first, c.r.sendErr = c.r.sendErr, nil, nil
	switch {
	case unsent:
		return 0, rerr, nil
	case werr != nil:
		return 0, werr, nil
	case rerr == nil && n == 0:
		return 0, nil, io.EOF
	}
	return n, nil, rerr
}
