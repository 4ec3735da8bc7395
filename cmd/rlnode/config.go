package main

import (
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/global"
	"github.com/ringlimit/ringlimit/internal/admit"
	"github.com/ringlimit/ringlimit/internal/tlsfiles"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/replica"
	"github.com/ringlimit/ringlimit/service"
	"github.com/ringlimit/ringlimit/snapshot"
)

// Config is every setting of a serving rlnode. Each field is a flag and,
// when the flag is not given, an RLNODE_* environment variable named after
// it (--http-addr is RLNODE_HTTP_ADDR).
type Config struct {
	HTTPAddr          string
	GRPCAddr          string
	PeerAddr          string
	GossipAddr        string
	AdvertiseAddr     string
	Join              []string
	NodeName          string
	MaxKeys           int
	BatchWait         time.Duration
	BatchLimit        int
	GlobalSync        time.Duration
	PolicyFile        string
	MaxClockSkew      time.Duration
	ShutdownTimeout   time.Duration
	HandOffWait       time.Duration
	ReplicateInterval time.Duration
	LogLevel          string
	MaxInflight       int
	MaxStreams        int
	MaxConns          int
	MemoryLimit       string
	MaxLogEntries     int
	SnapshotDir       string
	SnapshotInterval  time.Duration
	// PeerTLS is mutual TLS on the peer port; TLS is TLS on the HTTP and
	// gRPC ports. Empty files mean plaintext.
	PeerTLS tlsfiles.Files
	TLS     tlsfiles.Files
	// GossipKeys encrypt gossip; the first encrypts, all decrypt.
	GossipKeys [][]byte
	// Leases bounds the lessees' accounts of the keys this node owns.
	Leases global.LeaseConfig
}

// parseConfig reads flags from args, falling back to RLNODE_* variables via
// getenv. It is the only reader of the environment.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (Config, error) {
	hostname, _ := os.Hostname()
	var c Config
	var join, gossipKey string
	fs := flag.NewFlagSet("rlnode", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { writeUsage(fs) }
	fs.StringVar(&c.HTTPAddr, "http-addr", ":8080", "HTTP listen address (POST /v1/check, /metrics, /healthz, /readyz, /v1/members)")
	fs.StringVar(&c.GRPCAddr, "grpc-addr", ":8081", "gRPC listen address (ringlimit.v1.RateLimiter, health, reflection)")
	fs.StringVar(&c.PeerAddr, "peer-addr", ":8082", "gRPC listen address for peer traffic only (forwards, hand-off, GLOBAL sync)")
	fs.StringVar(&c.GossipAddr, "gossip-addr", ":7946", "memberlist bind address, TCP and UDP")
	fs.StringVar(&c.AdvertiseAddr, "advertise-addr", "", "address other nodes use to reach this one (default: first non-loopback IP)")
	fs.StringVar(&join, "join", "", "comma-separated host:port or DNS names to join through (none: a one-node cluster)")
	fs.StringVar(&c.NodeName, "node-name", hostname, "unique member name")
	fs.IntVar(&c.MaxKeys, "max-keys", limiter.DefaultMaxKeys, "counters kept in memory; beyond it the least recently used are evicted")
	fs.DurationVar(&c.BatchWait, "batch-wait", 500*time.Microsecond, "longest a forwarded check gathered behind a batch in flight to its owner waits before its batch is sent (a check with none in flight is sent at once)")
	fs.IntVar(&c.BatchLimit, "batch-limit", 1000, "checks that make a forwarding batch full: it is sent at once, even while another is in flight")
	fs.DurationVar(&c.GlobalSync, "global-sync", 100*time.Millisecond, "GLOBAL hit and broadcast interval")
	fs.StringVar(&c.PolicyFile, "policy-file", "", "YAML policies in the envoyproxy/ratelimit format; reloaded on change")
	fs.DurationVar(&c.MaxClockSkew, "max-clock-skew", service.DefaultMaxClockSkew, "bound on created_at_ms distance from the server clock")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "time to leave, hand off and drain before exit")
	fs.DurationVar(&c.HandOffWait, "handoff-wait", time.Second, "longest a check for a key this node has just come to own waits for the key's previous owner to hand its counter over (0: never wait, decide on what is here); under the forward deadline, 2s")
	fs.DurationVar(&c.ReplicateInterval, "replicate-interval", replica.DefaultInterval, "how often each node sends the counters that changed to the node that would inherit them, which takes them over should it crash: the hits of one interval are what a crash loses (0: no replication)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.IntVar(&c.MaxConns, "max-conns", defaultMaxConns, "connections open at once on each of the HTTP, gRPC and peer listeners; beyond it new ones wait to be accepted")
	fs.StringVar(&c.MemoryLimit, "memory-limit", "", "the Go runtime's soft memory limit, e.g. 512MiB (default: 90% of the container's memory limit, unless GOMEMLIMIT is set)")
	fs.IntVar(&c.MaxLogEntries, "max-log-entries", limiter.DefaultMaxLogEntries, "entries of all SLIDING_LOG counters held, 16 bytes each; beyond it the least recently used logs are evicted")
	fs.StringVar(&c.SnapshotDir, "snapshot-dir", "", "directory for this node's counters, written every --snapshot-interval and at shutdown, loaded at start: they survive a stop of the whole cluster (none: counters live in memory only)")
	fs.DurationVar(&c.SnapshotInterval, "snapshot-interval", snapshot.DefaultInterval, "how often the counters are written to --snapshot-dir: a node killed without its shutdown (SIGKILL, power loss) comes back with its counters as they were at most this long before")
	fs.IntVar(&c.MaxInflight, "max-inflight", admit.DefaultMax, "client requests (HTTP checks, gRPC calls and the requests of CheckStreams) in flight at once; beyond it they are refused at once, HTTP 503 or gRPC RESOURCE_EXHAUSTED")
	fs.IntVar(&c.MaxStreams, "max-streams", admit.DefaultMaxStreams, "CheckStream streams open at once (a Go client keeps one to each node); beyond it new ones are refused with RESOURCE_EXHAUSTED, and their clients use Check RPCs")
	fs.DurationVar(&c.Leases.TTL, "lease-ttl", global.DefaultLeaseTTL, "how long a grant lent to a lessee (a leased Go client) lives without a report; the lessee stops using it after three quarters of it (docs/leases.md)")
	fs.IntVar(&c.Leases.MaxLessees, "max-lessees", global.DefaultMaxLessees, "lessees holding accounts of keys this node owns; a report that would open an account beyond it is answered UNAVAILABLE")
	fs.IntVar(&c.Leases.MaxLeasesPerKey, "max-leases-per-key", global.DefaultMaxLeasesPerKey, "lessees' accounts of one key")
	fs.IntVar(&c.Leases.MaxKeysPerLessee, "max-keys-per-lessee", global.DefaultMaxKeysPerLessee, "one lessee's accounts of keys this node owns")
	fs.StringVar(&c.PeerTLS.Cert, "peer-tls-cert", "", "PEM certificate for the peer port, valid for --node-name, from the cluster CA; reloaded on change")
	fs.StringVar(&c.PeerTLS.Key, "peer-tls-key", "", "PEM key of --peer-tls-cert")
	fs.StringVar(&c.PeerTLS.CA, "peer-tls-ca", "", "PEM cluster CA: peers must present a certificate from it (mutual TLS)")
	fs.StringVar(&c.TLS.Cert, "tls-cert", "", "PEM certificate for TLS on the HTTP and gRPC ports; reloaded on change")
	fs.StringVar(&c.TLS.Key, "tls-key", "", "PEM key of --tls-cert")
	fs.StringVar(&c.TLS.CA, "tls-client-ca", "", "PEM CA: clients of the HTTP and gRPC ports must present a certificate from it")
	// Read as a string and parsed below, so that no error message repeats
	// a key.
	fs.StringVar(&gossipKey, "gossip-key", "", "base64 keys of 16, 24 or 32 bytes, comma-separated, for encrypted gossip; the first encrypts, all decrypt")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		env := "RLNODE_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(env); v != "" && !set[f.Name] {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", env, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	for _, j := range strings.Split(join, ",") {
		if j = strings.TrimSpace(j); j != "" {
			c.Join = append(c.Join, j)
		}
	}
	if gossipKey != "" {
		keys, err := parseGossipKeys(gossipKey)
		if err != nil {
			return Config{}, fmt.Errorf("--gossip-key: %w", err)
		}
		c.GossipKeys = keys
	}
	return c, c.validate()
}

func (c Config) validate() error {
	switch {
	case c.MaxKeys <= 0:
		return fmt.Errorf("--max-keys: must be positive, got %d", c.MaxKeys)
	case c.BatchLimit <= 0:
		return fmt.Errorf("--batch-limit: must be positive, got %d", c.BatchLimit)
	case c.BatchWait < 0:
		return fmt.Errorf("--batch-wait: must not be negative, got %v", c.BatchWait)
	case c.GlobalSync <= 0:
		return fmt.Errorf("--global-sync: must be positive, got %v", c.GlobalSync)
	case c.MaxClockSkew < 0:
		return fmt.Errorf("--max-clock-skew: must not be negative, got %v", c.MaxClockSkew)
	case c.HandOffWait < 0 || c.HandOffWait >= peer.DefaultTimeout:
		return fmt.Errorf("--handoff-wait: must be at least 0 and under the forward deadline (%v), so that a forwarded check is answered before its sender gives up; got %v", peer.DefaultTimeout, c.HandOffWait)
	case c.ReplicateInterval < 0:
		return fmt.Errorf("--replicate-interval: must not be negative (0 turns replication off), got %v", c.ReplicateInterval)
	case c.SnapshotInterval <= 0:
		return fmt.Errorf("--snapshot-interval: must be positive, got %v", c.SnapshotInterval)
	case c.ShutdownTimeout <= 0:
		return fmt.Errorf("--shutdown-timeout: must be positive, got %v", c.ShutdownTimeout)
	case c.MaxLogEntries < algorithms.MaxSlidingLogLimit:
		return fmt.Errorf("--max-log-entries: must hold one full log, %d, got %d", algorithms.MaxSlidingLogLimit, c.MaxLogEntries)
	case c.MaxConns <= 0:
		return fmt.Errorf("--max-conns: must be positive, got %d", c.MaxConns)
	case c.MaxInflight <= 0:
		return fmt.Errorf("--max-inflight: must be positive, got %d", c.MaxInflight)
	case c.MaxStreams <= 0:
		return fmt.Errorf("--max-streams: must be positive, got %d", c.MaxStreams)
	case c.Leases.TTL < 4*c.GlobalSync:
		return fmt.Errorf("--lease-ttl: must be at least 4 × --global-sync (%v), so that lessees renew a grant several times in its life; got %v", 4*c.GlobalSync, c.Leases.TTL)
	case c.Leases.MaxLessees <= 0 || c.Leases.MaxLeasesPerKey <= 0 || c.Leases.MaxKeysPerLessee <= 0:
		return fmt.Errorf("--max-lessees, --max-leases-per-key, --max-keys-per-lessee: must be positive, got %d, %d, %d",
			c.Leases.MaxLessees, c.Leases.MaxLeasesPerKey, c.Leases.MaxKeysPerLessee)
	case c.NodeName == "":
		return errors.New("--node-name: must not be empty")
	case c.PeerTLS != (tlsfiles.Files{}) && (c.PeerTLS.Cert == "" || c.PeerTLS.Key == "" || c.PeerTLS.CA == ""):
		return errors.New("--peer-tls-cert, --peer-tls-key, --peer-tls-ca: give all three or none")
	case c.TLS != (tlsfiles.Files{}) && (c.TLS.Cert == "" || c.TLS.Key == ""):
		return errors.New("--tls-cert, --tls-key: give both (and --tls-client-ca optionally) or none")
	}
	if c.MemoryLimit != "" {
		if _, err := parseBytes(c.MemoryLimit); err != nil {
			return fmt.Errorf("--memory-limit: %w", err)
		}
	}
	return nil
}

// parseGossipKeys reads --gossip-key: base64 keys separated by commas,
// each 16, 24 or 32 bytes (AES-128, -192 or -256).
func parseGossipKeys(v string) ([][]byte, error) {
	var keys [][]byte
	for i, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("key %d: not base64", i+1) // err would quote the key
		}
		if n := len(k); n != 16 && n != 24 && n != 32 {
			return nil, fmt.Errorf("key %d: %d bytes, want 16, 24 or 32", i+1, n)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, errors.New("no key")
	}
	return keys, nil
}
