//go:build unix

package snapshot

import (
	"errors"
	"syscall"
)

// openFlags open a snapshot without following a symbolic link and
// without waiting for a FIFO's writer.
const openFlags = syscall.O_NOFOLLOW | syscall.O_NONBLOCK

// isSymlinkRefusal reports whether err is open's refusal of a symbolic
// link under O_NOFOLLOW.
func isSymlinkRefusal(err error) bool { return errors.Is(err, syscall.ELOOP) }
