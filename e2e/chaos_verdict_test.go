//go:build chaos

package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// failures holds each running chaos test's failure messages (errorf,
// fatalf), so that a failed test's last lines say why it failed, below
// the nodes' logs its cleanups print: CI shows a failed run's last lines.
var failures sync.Map // *testing.T -> *verdict

// verdict is one test's failure messages.
type verdict struct {
	mu   sync.Mutex
	msgs []string
}

// recordFailures makes t's failure messages its last lines, if it fails.
// Called first in a test, before any cleanup it registers.
func recordFailures(t *testing.T) {
	v := &verdict{}
	failures.Store(t, v)
	t.Cleanup(func() {
		failures.Delete(t)
		v.mu.Lock()
		defer v.mu.Unlock()
		if t.Failed() && len(v.msgs) > 0 {
			t.Logf("%s failed (the nodes' logs are above):\n\t%s", t.Name(), strings.Join(v.msgs, "\n\t"))
		}
	})
}

// record keeps msg among t's failure messages.
func record(t *testing.T, msg string) {
	if v, ok := failures.Load(t); ok {
		v := v.(*verdict)
		v.mu.Lock()
		v.msgs = append(v.msgs, msg)
		v.mu.Unlock()
	}
}

// errorf is t.Errorf, remembered for the test's last lines.
func errorf(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	record(t, msg)
	t.Error(msg)
}

// fatalf is t.Fatalf, remembered for the test's last lines.
func fatalf(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	record(t, msg)
	t.Fatal(msg)
}
