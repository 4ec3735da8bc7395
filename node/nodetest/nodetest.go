// Package nodetest runs ringlimit nodes inside a test process, as
// net/http/httptest runs servers: on loopback ports chosen by the kernel,
// with real gRPC and real memberlist, stopped when the test ends.
package nodetest

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/node"
)

// Config is node.DefaultConfig named name, on 127.0.0.1 ports chosen by
// the kernel.
func Config(name string) node.Config {
	c := node.DefaultConfig()
	c.NodeName = name
	c.HTTPAddr, c.GRPCAddr, c.PeerAddr, c.GossipAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	return c
}

// Start builds a node of conf and runs it until stop is called or the
// test ends, and returns it once its gossip port is bound (so that others
// can join it at n.Cluster().GossipAddr()). stop ends the node's Run and
// returns its error; it may be called more than once. A node that fails
// to build or to start within 10s fails the test. Its log is discarded,
// unless RINGLIMIT_TEST_LOG is set: then it goes to stderr, each line
// naming the node, to see why a rare failure happened.
func Start(t testing.TB, conf node.Config) (n *node.Node, stop func() error) {
	t.Helper()
	n, err := node.New(conf, testLogger(conf.NodeName))
	if err != nil {
		t.Fatalf("node %s: %v", conf.NodeName, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	var once sync.Once
	var stopErr error
	stop = func() error {
		once.Do(func() { cancel(); stopErr = <-done })
		return stopErr
	}
	t.Cleanup(func() { stop() })
	// The gossip port is known once the cluster's Run has bound it.
	for deadline := time.Now().Add(10 * time.Second); n.Cluster().GossipAddr() == ""; time.Sleep(5 * time.Millisecond) {
		select {
		case err := <-done:
			done <- err // for stop
			t.Fatalf("node %s: Run returned %v before its gossip started", conf.NodeName, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: gossip did not start within 10s", conf.NodeName)
		}
	}
	return n, stop
}

// testLogger is the log of the node name (see Start).
func testLogger(name string) *slog.Logger {
	if os.Getenv("RINGLIMIT_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("node", name)
}
