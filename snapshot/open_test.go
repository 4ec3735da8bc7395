package snapshot

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringlimit/ringlimit/limiter"
)

// TestLoadStopsAtItsBoundOrWhenCanceled: a load that its time bound
// (Config.LoadTimeout) or its caller's context ends stops at its next
// read, merges nothing more, says why in the log and the metric
// (timeout, canceled), and leaves the file where it is, since nothing
// was found wrong with it: the next start loads it.
func TestLoadStopsAtItsBoundOrWhenCanceled(t *testing.T) {
	for _, tc := range []struct {
		name, reason, says string
		bound              time.Duration
		ctx                func() context.Context
	}{
		{"time bound", "timeout", "load stopped at its time bound", time.Nanosecond, context.Background},
		{"caller canceled", "canceled", "the node is stopping", 0, func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig, dir, data := written(t, "n1", "a", "b", "c")
			d := openDir(t, dir, "n1", limiter.New(limiter.Config{}))
			if tc.bound > 0 {
				d.loadLimit = tc.bound
			}
			if n := d.Load(tc.ctx(), intake); n != 0 || d.store.Len() != 0 {
				t.Errorf("Load took %d counters, the store holds %d; want none", n, d.store.Len())
			}
			if got := testutil.ToFloat64(d.metrics.loadErrors.WithLabelValues(tc.reason)); got != 1 {
				t.Errorf("load errors{reason=%q} = %v, want 1", tc.reason, got)
			}
			if logs := d.logs.String(); !strings.Contains(logs, tc.says) || strings.Contains(logs, "snapshot refused") {
				t.Errorf("log does not say %q, or says the file was refused:\n%s", tc.says, logs)
			}
			if kept, err := os.ReadFile(filepath.Join(dir, FileName)); err != nil || !bytes.Equal(kept, data) {
				t.Errorf("the snapshot was not left in place: %v", err)
			}
			// The next start, unhurried, loads it.
			again := openDir(t, dir, "n1", limiter.New(limiter.Config{}))
			if n := again.Load(context.Background(), intake); n != orig.store.Len() {
				t.Errorf("the next load took %d counters, want the %d written", n, orig.store.Len())
			}
		})
	}
}
