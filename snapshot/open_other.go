//go:build !unix

package snapshot

// openFlags: other systems have no O_NOFOLLOW or O_NONBLOCK to give open;
// the fstat after it still refuses what is not a regular file.
const openFlags = 0

func isSymlinkRefusal(error) bool { return false }
