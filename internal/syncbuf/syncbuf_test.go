package syncbuf

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// TestConcurrentWritesAndReads: writers and a reader at once (run with
// -race), nothing lost, and Tail cuts to the last bytes.
func TestConcurrentWritesAndReads(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 100 {
				fmt.Fprintf(&b, "%d.%d\n", w, i)
			}
		})
	}
	wg.Go(func() {
		for range 100 {
			_ = b.String()
		}
	})
	wg.Wait()
	if n := strings.Count(b.String(), "\n"); n != 400 {
		t.Errorf("%d lines, want 400", n)
	}
	var small Buffer
	small.Write([]byte("0123456789"))
	if got := small.Tail(4); got != "[...]\n6789" {
		t.Errorf("Tail(4) = %q", got)
	}
	if got := small.Tail(10); got != "0123456789" {
		t.Errorf("Tail(10) = %q", got)
	}
}
