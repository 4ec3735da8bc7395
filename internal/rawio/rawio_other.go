//go:build !linux

package rawio

import "net"

// Wrap returns nc: raw system calls are used on Linux only
// (rawio_linux.go).
func Wrap(nc net.Conn) net.Conn { return nc }
