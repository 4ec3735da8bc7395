package main

import (
	"encoding/base64"
	"fmt"
	"io"
	"maps"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// gossipKey is a valid --gossip-key: with it, the gossip port is not in
// protected mode (see Config.protect).
var gossipKey = base64.StdEncoding.EncodeToString(make([]byte, 32))

// secured is the environment of a node with every port's security
// configured, with m's variables besides: client and peer TLS (by paths,
// which parseConfig does not read) and a gossip key, so that no port is in
// protected mode (see Config.protect).
func secured(m map[string]string) func(string) string {
	all := map[string]string{"RLNODE_GOSSIP_KEY": gossipKey, "RLNODE_TLS_CERT": "c.pem", "RLNODE_TLS_KEY": "k.pem",
		"RLNODE_PEER_TLS_CERT": "c.pem", "RLNODE_PEER_TLS_KEY": "k.pem", "RLNODE_PEER_TLS_CA": "ca.pem"}
	maps.Copy(all, m)
	return env(all)
}

// TestParseConfigDefaults: the defaults of a node with security
// configured; without, its ports are on loopback (see
// TestParseConfigLoopback).
func TestParseConfigDefaults(t *testing.T) {
	c, err := parseConfig(nil, secured(nil), io.Discard)
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
	c, err := parseConfig([]string{"--http-addr", "127.0.0.1:9000", "--join", "a:7946, b"}, secured(map[string]string{
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
		{[]string{"--strict-quorum", "-1"}, nil, "--strict-quorum"},
		{nil, map[string]string{"RLNODE_STRICT_QUORUM": "most"}, "RLNODE_STRICT_QUORUM"},
		{[]string{"--strict-quorum", "3", "--strict-fence", "3s"}, nil, "--strict-fence"},
		{[]string{"--snapshot-interval", "0s"}, nil, "--snapshot-interval"},
		{nil, map[string]string{"RLNODE_SNAPSHOT_INTERVAL": "often"}, "RLNODE_SNAPSHOT_INTERVAL"},
		{[]string{"stray"}, nil, "stray"},
		{[]string{"--reconnect-interval", "0s"}, nil, "--reconnect-interval"},
		{[]string{"--reconnect-timeout", "-1s"}, nil, "--reconnect-timeout"},
		{[]string{"--node-name", "rl-2", "--bootstrap", "rl-1"}, nil, "--bootstrap"},
	}
	for _, c := range cases {
		_, err := parseConfig(c.args, env(c.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: err %v, want one naming %s", c.args, c.env, err, c.want)
		}
	}
}

// TestParseConfigLoopback: with no security configured, the ports given
// no address (flag or variable) listen on 127.0.0.1 only, those given one
// where they are told; any security setting turns the rule off; and a
// node whose peer or gossip port is on loopback while --join,
// --advertise-addr or the other port reach other hosts is refused,
// naming the flags that fix it.
func TestParseConfigLoopback(t *testing.T) {
	wide := map[string]string{"http": ":8080", "grpc": ":8081", "peer": ":8082", "gossip": ":7946"}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want map[string]string // addresses by port; "" for an error
		err  []string          // parts of the error
	}{
		{"bare", nil, nil, map[string]string{"http": "127.0.0.1:8080", "grpc": "127.0.0.1:8081", "peer": "127.0.0.1:8082", "gossip": "127.0.0.1:7946"}, nil},
		{"an address given by flag and by variable", []string{"--http-addr", ":9080"}, map[string]string{"RLNODE_GRPC_ADDR": "0.0.0.0:9081"},
			map[string]string{"http": ":9080", "grpc": "0.0.0.0:9081", "peer": "127.0.0.1:8082", "gossip": "127.0.0.1:7946"}, nil},
		// Each port's own security opens it, and no other: a node with
		// client TLS alone keeps its peer and gossip ports to itself.
		{"client TLS", []string{"--tls-cert", "c.pem", "--tls-key", "k.pem"}, nil,
			map[string]string{"http": ":8080", "grpc": ":8081", "peer": "127.0.0.1:8082", "gossip": "127.0.0.1:7946"}, nil},
		{"peer TLS and a gossip key", []string{"--peer-tls-cert", "c.pem", "--peer-tls-key", "k.pem", "--peer-tls-ca", "ca.pem"},
			map[string]string{"RLNODE_GOSSIP_KEY": gossipKey},
			map[string]string{"http": "127.0.0.1:8080", "grpc": "127.0.0.1:8081", "peer": ":8082", "gossip": ":7946"}, nil},
		{"all three", []string{"--tls-cert", "c.pem", "--tls-key", "k.pem"}, map[string]string{"RLNODE_GOSSIP_KEY": gossipKey,
			"RLNODE_PEER_TLS_CERT": "c.pem", "RLNODE_PEER_TLS_KEY": "k.pem", "RLNODE_PEER_TLS_CA": "ca.pem"}, wide, nil},
		// Gossip open to the network with the peer port on loopback, or
		// the other way round, would be joined by nodes that cannot reach
		// this one.
		{"a gossip key alone", nil, map[string]string{"RLNODE_GOSSIP_KEY": gossipKey}, nil, []string{"--gossip-addr :7946", "--peer-addr", "--peer-tls-cert"}},
		{"peer TLS alone", []string{"--peer-tls-cert", "c.pem", "--peer-tls-key", "k.pem", "--peer-tls-ca", "ca.pem"}, nil, nil,
			[]string{"--peer-addr :8082", "--gossip-addr", "--gossip-key"}},
		{"a gossip key and a peer address", []string{"--peer-addr", ":8082"}, map[string]string{"RLNODE_GOSSIP_KEY": gossipKey},
			map[string]string{"http": "127.0.0.1:8080", "grpc": "127.0.0.1:8081", "peer": ":8082", "gossip": ":7946"}, nil},
		{"joining this host", []string{"--join", "127.0.0.1:7946,localhost:8946"}, nil,
			map[string]string{"http": "127.0.0.1:8080", "grpc": "127.0.0.1:8081", "peer": "127.0.0.1:8082", "gossip": "127.0.0.1:7946"}, nil},
		{"joining another host", []string{"--join", "10.0.0.1:7946"}, nil, nil, []string{"--join 10.0.0.1:7946", "--peer-addr and --gossip-addr", "--gossip-key"}},
		{"joining by name", nil, map[string]string{"RLNODE_JOIN": "ringlimit:7946"}, nil, []string{"--join ringlimit:7946"}},
		{"advertising another host", []string{"--advertise-addr", "10.0.0.5"}, nil, nil, []string{"--advertise-addr 10.0.0.5", "--peer-addr"}},
		{"gossip wide, peer on loopback", []string{"--gossip-addr", ":7946"}, nil, nil, []string{"--gossip-addr :7946", "--peer-addr"}},
		{"both peer ports given", []string{"--gossip-addr", ":7946", "--peer-addr", ":8082", "--join", "10.0.0.1"}, nil,
			map[string]string{"http": "127.0.0.1:8080", "grpc": "127.0.0.1:8081", "peer": ":8082", "gossip": ":7946"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseConfig(tc.args, env(tc.env), io.Discard)
			if tc.err != nil {
				for _, part := range tc.err {
					if err == nil || !strings.Contains(err.Error(), part) {
						t.Errorf("error %v, want one saying %q", err, part)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{"http": c.HTTPAddr, "grpc": c.GRPCAddr, "peer": c.PeerAddr, "gossip": c.GossipAddr}
			if !maps.Equal(got, tc.want) {
				t.Errorf("addresses %v, want %v", got, tc.want)
			}
			if onLoopback := strings.Count(strings.Join(c.loopback, " "), "127.0.0.1"); onLoopback != strings.Count(fmt.Sprint(tc.want), "127.0.0.1") {
				t.Errorf("loopback notes %q for addresses %v", c.loopback, tc.want)
			}
		})
	}
}
