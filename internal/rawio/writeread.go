package rawio

import "net"

// WriteRead writes w whole to nc and then reads into r, as Write and
// then Read would: werr is the write's error (then nothing was read),
// rerr the read's. It is for a connection that carries one command and
// its answer at a time, nothing else, so that nothing can arrive before
// the answer to w: on a connection from Wrap (on Linux), it does not look
// for an answer before one can have come, which saves a read(2) a command
// that would find nothing (EAGAIN) and cost about as much as any other
// system call. Elsewhere it is a Write and a Read.
func WriteRead(nc net.Conn, w, r []byte) (n int, werr, rerr error) {
	if c, ok := nc.(interface {
		writeRead(w, r []byte) (int, error, error)
	}); ok {
		return c.writeRead(w, r)
	}
	if _, err := nc.Write(w); err != nil {
		return 0, err, nil
	}
	n, rerr = nc.Read(r)
	return n, nil, rerr
}
