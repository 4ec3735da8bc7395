package loadgen

import (
	"fmt"
	"io"
	"os"
	"time"
)

// A run shows its progress on stderr, so that stdout holds only the
// result. On a terminal one line is rewritten in place every ttyEvery and
// erased at the end; elsewhere (a file, a pipe, CI) a plain line is
// written every plainEvery, so that a short run adds nothing to a log and
// a long one still shows that it is alive.
const (
	ttyEvery   = time.Second
	plainEvery = 10 * time.Second
)

// tally is what the workers have counted so far.
type tally struct {
	answered, errors int64
}

// IsTerminal reports whether w is a character device, such as a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// showProgress writes the progress of a run that began at start to w,
// reading the workers' counts with read, until done is closed; it returns
// once it has stopped writing.
func showProgress(w io.Writer, tty bool, start time.Time, done <-chan struct{}, read func() tally) {
	every := plainEvery
	if tty {
		every = ttyEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var last tally
	lastAt := start
	for {
		select {
		case <-done:
			if tty {
				io.WriteString(w, "\r\x1b[K") // erase the line: the result follows
			}
			return
		case now := <-tick.C:
			t := read()
			rate := float64(t.answered-last.answered) / now.Sub(lastAt).Seconds()
			line := fmt.Sprintf("%6.0fs  %d checks  %.0f checks/s  %d errors",
				now.Sub(start).Seconds(), t.answered, rate, t.errors)
			if tty {
				fmt.Fprintf(w, "\r\x1b[K%s", line)
			} else {
				fmt.Fprintln(w, line)
			}
			last, lastAt = t, now
		}
	}
}
