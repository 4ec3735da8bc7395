package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseConfigDefaults(t *testing.T) {
	c, err := parseConfig(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPAddr != ":8080" || c.GRPCAddr != ":8081" || c.PeerAddr != ":8082" || c.GossipAddr != ":7946" ||
		c.MaxKeys != 1_000_000 || c.BatchWait != 500*time.Microsecond || c.BatchLimit != 1000 ||
		c.GlobalSync != 100*time.Millisecond || c.MaxClockSkew != 10*time.Minute || c.ShutdownTimeout != 30*time.Second ||
		c.ReplicateInterval != 100*time.Millisecond || len(c.Join) != 0 ||
		c.SnapshotDir != "" || c.SnapshotInterval != 10*time.Second {
		t.Errorf("defaults: %+v", c)
	}
}

func TestParseConfigFlagsBeatEnvironment(t *testing.T) {
	c, err := parseConfig([]string{"--http-addr", "127.0.0.1:9000", "--join", "a:7946, b"}, env(map[string]string{
		"RLNODE_HTTP_ADDR":  "127.0.0.1:1",
		"RLNODE_GRPC_ADDR":  "127.0.0.1:9001",
		"RLNODE_MAX_KEYS":   "42",
		"RLNODE_BATCH_WAIT": "1ms",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPAddr != "127.0.0.1:9000" || c.GRPCAddr != "127.0.0.1:9001" || c.MaxKeys != 42 || c.BatchWait != time.Millisecond {
		t.Errorf("got %+v", c)
	}
	if len(c.Join) != 2 || c.Join[0] != "a:7946" || c.Join[1] != "b" {
		t.Errorf("join = %q", c.Join)
	}
}

// TestParseConfigSnapshots: snapshots are off unless --snapshot-dir (or
// RLNODE_SNAPSHOT_DIR) names a directory; the interval comes from its
// flag or variable too.
func TestParseConfigSnapshots(t *testing.T) {
	c, err := parseConfig(nil, env(map[string]string{"RLNODE_SNAPSHOT_DIR": "/var/lib/ringlimit", "RLNODE_SNAPSHOT_INTERVAL": "30s"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.SnapshotDir != "/var/lib/ringlimit" || c.SnapshotInterval != 30*time.Second {
		t.Errorf("from the environment: dir %q, interval %v", c.SnapshotDir, c.SnapshotInterval)
	}
	c, err = parseConfig([]string{"--snapshot-dir", "/data", "--snapshot-interval", "1s"}, env(map[string]string{"RLNODE_SNAPSHOT_DIR": "/other"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.SnapshotDir != "/data" || c.SnapshotInterval != time.Second {
		t.Errorf("from flags: dir %q, interval %v", c.SnapshotDir, c.SnapshotInterval)
	}
}

func TestParseConfigErrorsNameTheSetting(t *testing.T) {
	cases := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, map[string]string{"RLNODE_MAX_KEYS": "many"}, "RLNODE_MAX_KEYS"},
		{[]string{"--max-keys", "0"}, nil, "--max-keys"},
		{[]string{"--global-sync", "0s"}, nil, "--global-sync"},
		{[]string{"--batch-limit", "-1"}, nil, "--batch-limit"},
		{[]string{"--shutdown-timeout", "0s"}, nil, "--shutdown-timeout"},
		{[]string{"--handoff-wait", "-1s"}, nil, "--handoff-wait"},
		{[]string{"--handoff-wait", "2s"}, nil, "--handoff-wait"},
		{[]string{"--replicate-interval", "-1ms"}, nil, "--replicate-interval"},
		{[]string{"--snapshot-interval", "0s"}, nil, "--snapshot-interval"},
		{nil, map[string]string{"RLNODE_SNAPSHOT_INTERVAL": "often"}, "RLNODE_SNAPSHOT_INTERVAL"},
		{[]string{"stray"}, nil, "stray"},
	}
	for _, c := range cases {
		_, err := parseConfig(c.args, env(c.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: err %v, want one naming %s", c.args, c.env, err, c.want)
		}
	}
}
