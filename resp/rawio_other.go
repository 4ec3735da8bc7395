//go:build !linux

package resp

import "net"

// withRawIO returns nc: raw system calls are used on Linux only
// (rawio_linux.go).
func withRawIO(nc net.Conn) net.Conn { return nc }
