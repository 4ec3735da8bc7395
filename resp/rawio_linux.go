package resp

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
type rawConn struct {
	net.Conn // deadlines, addresses, Close
	rc       syscall.RawConn
}

// withRawIO returns nc reading and writing through rawConn when it is a
// socket, or nc itself.
func withRawIO(nc net.Conn) net.Conn {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nc
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nc
	}
	return rawConn{nc, rc}
}

func (c rawConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n uintptr
	var errno syscall.Errno
	err := c.rc.Read(func(fd uintptr) bool {
		for {
			n, _, errno = syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			if errno != syscall.EINTR {
				return errno != syscall.EAGAIN
			}
		}
	})
	switch {
	case err != nil:
		return 0, err
	case errno != 0:
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: errno}
	case n == 0:
		return 0, io.EOF
	}
	return int(n), nil
}

func (c rawConn) Write(p []byte) (int, error) {
	written := 0
	var errno syscall.Errno
	err := c.rc.Write(func(fd uintptr) bool {
		for written < len(p) {
			var n uintptr
			n, _, errno = syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[written])), uintptr(len(p)-written))
			switch errno {
			case 0:
				written += int(n)
			case syscall.EINTR:
			case syscall.EAGAIN:
				errno = 0
				return false
			default:
				return true
			}
		}
		return true
	})
	switch {
	case err != nil:
		return written, err
	case errno != 0:
		return written, &net.OpError{Op: "write", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: errno}
	}
	return written, nil
}
