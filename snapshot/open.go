package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"
)

// ErrNotRegular: the snapshot's path is not a regular file (a FIFO, a
// socket, a device, a directory or a symbolic link). Load refuses it
// without reading it: a FIFO would block the read, and so the start, for
// as long as no one writes to it; a device could be read forever; a link
// could point anywhere.
var ErrNotRegular = errors.New("not a regular file")

// DefaultLoadTimeout bounds a whole Load: the two reads of the file and
// the merge. A snapshot of 1,000,000 counters (83 MB) loads in about a
// second; the largest file a store at the default --max-keys could have
// written (about 3.1 GB, every counter a full sliding log) reads twice
// within it from a disk of 100 MB/s or more. A load cut short by it keeps
// what it merged (each counter validated) and the node starts: a slow or
// stuck disk delays the start by this much at most.
const DefaultLoadTimeout = time.Minute

// openRegular opens path for reading if it is a regular file, and
// refuses anything else with an error wrapping ErrNotRegular that names
// what it is. It opens without following a symbolic link and without
// blocking (openFlags), so that opening a FIFO with no writer returns at
// once, and then asks the open file (fstat) what it is: no other process
// can swap the file in between.
func openRegular(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|openFlags, 0)
	if err != nil {
		if isSymlinkRefusal(err) {
			return nil, fmt.Errorf("a symbolic link: %w", ErrNotRegular)
		}
		return nil, err
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !info.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: %w", kind(info.Mode()), ErrNotRegular)
	}
	return f, nil
}

// kind names the type of a file that is not a regular one.
func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO (named pipe)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return fmt.Sprintf("of mode %v", m)
}

// ctxReader reads from r until ctx ends, so that the load's time bound,
// or a signal to stop, ends a read of the file between two reads of
// the disk.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := ended(c.ctx); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// ended returns ctx's error, or context.DeadlineExceeded once ctx's
// deadline has passed though its timer may not have fired yet: the bound
// holds at each read, however late the timer runs on a loaded machine.
// (Deadlines are on the real clock, not on a Dir's.)
func ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}
