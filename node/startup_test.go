package node_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ringlimit/ringlimit/internal/syncbuf"
	"github.com/ringlimit/ringlimit/node"
	"github.com/ringlimit/ringlimit/node/nodetest"
	"github.com/ringlimit/ringlimit/snapshot"
)

// TestStopWhileLoadingTheSnapshot: a node asked to stop (SIGTERM) while
// it loads its snapshot returns from Run at once, says so, and starts
// nothing: no gossip, nothing to leave, and no final snapshot written
// over the file it had only begun to load, which the next start loads
// whole. (On main, it went on to start gossip and serve, then left, and
// wrote a final snapshot of what it had loaded over the file.)
func TestStopWhileLoadingTheSnapshot(t *testing.T) {
	conf := nodetest.Config("n1")
	conf.SnapshotDir = t.TempDir()
	_, stop := nodetest.Start(t, conf)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(conf.SnapshotDir, snapshot.FileName)
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the first run wrote no snapshot: %v", err)
	}

	logs := &syncbuf.Buffer{}
	n, err := node.New(conf, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the signal came before, or while, the snapshot loads
	if err := n.Run(ctx); err != nil {
		t.Errorf("Run = %v, want nil: a stop asked for", err)
	}
	if !strings.Contains(logs.String(), "stopped during start-up, while loading the snapshot") {
		t.Errorf("the log does not say where the start-up stopped:\n%s", logs)
	}
	if addr := n.Cluster().GossipAddr(); addr != "" {
		t.Errorf("gossip started at %s, want never started", addr)
	}
	if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, before) {
		t.Errorf("the snapshot was written over (%v): want it as the first run left it", err)
	}
}
