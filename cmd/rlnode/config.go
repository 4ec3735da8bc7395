package main

import (
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/internal/tlsfiles"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/node"
	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/strict"
)

// Config is every setting of a serving rlnode: the node's, and the
// process's own. Each field is a flag and, when the flag is not given, an
// RLNODE_* environment variable named after it (--http-addr is
// RLNODE_HTTP_ADDR).
type Config struct {
	node.Config
	LogLevel    string
	MemoryLimit string
	// loopback lists the address flags, with their values, of the ports
	// that listen on loopback only because none was given and no security
	// is configured (see protect).
	loopback []string
	// join and gossipKey are --join and --gossip-key as given, which
	// parseConfig reads into Join and GossipKeys.
	join, gossipKey string
}

// parseConfig reads flags from args, falling back to RLNODE_* variables via
// getenv. It is the only reader of the environment. -h prints the usage
// (writeUsage) to stderr.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (Config, error) {
	hostname, _ := os.Hostname()
	var c Config
	fs := c.flags(hostname)
	fs.SetOutput(stderr)
	fs.Usage = func() { writeUsage(fs.Output()) }
	if err := parseFlags(fs, args, 0); err != nil {
		return Config{}, err
	}
	// given holds the flags set on the command line or, failing that, by
	// their variable.
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		env := envName(f.Name)
		if v := getenv(env); v != "" && !given[f.Name] {
			given[f.Name] = true
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, badValue(env, f.Value, v, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	for _, j := range strings.Split(c.join, ",") {
		if j = strings.TrimSpace(j); j != "" {
			c.Join = append(c.Join, j)
		}
	}
	if c.gossipKey != "" {
		keys, err := parseGossipKeys(c.gossipKey)
		if err != nil {
			return Config{}, fmt.Errorf("--gossip-key: %w", err)
		}
		c.GossipKeys = keys
	}
	if err := c.validate(); err != nil {
		return Config{}, err
	}
	return c, c.protect(given)
}

// envName is the environment variable of the serving flag name:
// --http-addr is RLNODE_HTTP_ADDR.
func envName(name string) string {
	return "RLNODE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// flags returns the serving flags, each setting its field of c, with
// hostname the default of --node-name. Where each is shown in the help
// is flagPlaces'.
func (c *Config) flags(hostname string) *flag.FlagSet {
	d := node.DefaultConfig()
	fs := flag.NewFlagSet("rlnode", flag.ContinueOnError)
	fs.StringVar(&c.HTTPAddr, "http-addr", d.HTTPAddr, "HTTP listen address (POST /v1/check and /v1/settle; GET /v1/members, /v1/top, /status, /metrics, /healthz, /readyz)"+loopbackUsage)
	fs.StringVar(&c.GRPCAddr, "grpc-addr", d.GRPCAddr, "gRPC listen address (ringlimit.v1.RateLimiter, Envoy's rate limit and rate limit quota services, health, reflection)"+loopbackUsage)
	fs.StringVar(&c.PeerAddr, "peer-addr", d.PeerAddr, "gRPC listen address for peer traffic only (forwards, hand-off, replication, GLOBAL sync, relayed leases and settles, the counts of GET /v1/top)"+loopbackUsage)
	fs.StringVar(&c.RESPAddr, "resp-addr", "", "Redis protocol listen address (CL.THROTTLE as redis-cell answers it, and RL.CHECK, where the Go client sends its checks once a node names the port: docs/resp.md), with the TLS, connection bounds and timeouts of the HTTP port (none: off)")
	fs.StringVar(&c.GossipAddr, "gossip-addr", d.GossipAddr, "memberlist bind address, TCP and UDP"+loopbackUsage)
	fs.StringVar(&c.AdvertiseAddr, "advertise-addr", "", "address other nodes use to reach this one (default: the IP --gossip-addr binds, 127.0.0.1 on loopback only; on all interfaces, the first private or else non-loopback IP)")
	fs.StringVar(&c.join, "join", "", "comma-separated host:port or DNS names of other nodes to join through; the node is not ready until one of them answers, and keeps retrying with backoff (none: a one-node cluster that others may join)")
	fs.StringVar(&c.Bootstrap, "bootstrap", "", "the --node-name of the node that starts a new cluster, the same on every node: that node is ready alone when none of its --join addresses answers, where every other waits for one (none: every node given --join waits)")
	fs.DurationVar(&c.ReconnectInterval, "reconnect-interval", d.ReconnectInterval, "how often the node tries to join again a few members that were declared dead or left, so that one restarted at its address after gossip forgot it is found again")
	fs.DurationVar(&c.ReconnectTimeout, "reconnect-timeout", d.ReconnectTimeout, "how long after a member was declared dead or left the node keeps trying to join it again")
	fs.StringVar(&c.NodeName, "node-name", hostname, "unique member name (default: the host name)")
	fs.IntVar(&c.MaxKeys, "max-keys", d.MaxKeys, "counters kept in memory; beyond it counters back to full are evicted first, and when none is the least recently used is evicted with its debt kept in 16 bytes until it refills, so that spent users stay spent and new keys are admitted")
	fs.DurationVar(&c.BatchWait, "batch-wait", d.BatchWait, "longest a forwarded check gathered behind a batch in flight to its owner waits before its batch is sent (a check with none in flight is sent at once)")
	fs.IntVar(&c.BatchLimit, "batch-limit", d.BatchLimit, "checks that make a forwarding batch full: it is sent at once, even while another is in flight")
	fs.DurationVar(&c.GlobalSync, "global-sync", d.GlobalSync, "GLOBAL hit and broadcast interval")
	fs.StringVar(&c.PolicyFile, "policy-file", "", "a YAML file, or a directory of them, of policies in the envoyproxy/ratelimit format (docs/policies.md); reloaded on change")
	fs.DurationVar(&c.MaxClockSkew, "max-clock-skew", d.MaxClockSkew, "bound on created_at_ms distance from the server clock")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", d.ShutdownTimeout, "time to leave, hand off and drain before exit")
	fs.DurationVar(&c.HandOffWait, "handoff-wait", d.HandOffWait, "longest a check for a key this node has just come to own waits for the key's previous owner to hand its counter over (0: never wait, decide on what is here); under the forward deadline, 2s")
	fs.DurationVar(&c.ReplicateInterval, "replicate-interval", d.ReplicateInterval, "how often each node sends the counters that changed to the node that would inherit them, which takes them over should it crash: the hits of one interval are what a crash loses (0: no replication)")
	fs.IntVar(&c.StrictQuorum, "strict-quorum", d.StrictQuorum, "strict mode (docs/strict.md): never admit more than the limit in a partition or crash; a node decides keys only while it sees at least this many members (a majority of the cluster), and a check whose owner cannot be reached is refused unless this node holds escrow for it (0: off; every node must agree)")
	fs.DurationVar(&c.StrictFence, "strict-fence", d.StrictFence, "strict mode: how long keys of a member that dropped out of the ring without saying it left (a crash, a freeze, a partition; a graceful leave is not fenced) wait before their new owner decides them; above memberlist's verdict, --lease-ttl and the escrow's time-to-live (10 × --global-sync, at least 1s)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.IntVar(&c.MaxConns, "max-conns", d.MaxConns, "connections open at once on each of the HTTP, gRPC, peer and RESP listeners (not gossip), an eighth of them at most yet to make a first request; beyond it a new one is closed as soon as it is accepted, or takes the place of one yet to make a request from an address range holding more")
	fs.IntVar(&c.MaxConnsPerSource, "max-conns-per-source", d.MaxConnsPerSource, "connections open at once from one IP address on each of the HTTP, gRPC, peer and RESP listeners, twice this from its /24 (IPv6: /64), an eighth of either yet to make a first request, so that one host or network cannot take every slot; beyond it a new one is closed as soon as it is accepted; the cluster's members are not held to the range's share on the peer port; leave room for proxies (Envoy opens one per worker thread) and NAT (0: no bound per address or range)")
	fs.DurationVar(&c.HandshakeTimeout, "handshake-timeout", d.HandshakeTimeout, "longest a new connection to the HTTP, gRPC, peer or RESP port may take over its TLS and HTTP/2 handshakes and to its first request (an HTTP request's headers, a gRPC call, a RESP command), and a RESP command over its rest once it has begun; beyond it the connection is closed")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", d.IdleTimeout, "a connection that has carried no request for this long is closed, on the HTTP (keep-alive), gRPC, peer and RESP ports (not gossip, which memberlist times itself); clients reconnect when they need to")
	fs.DurationVar(&c.StreamSendTimeout, "stream-send-timeout", d.StreamSendTimeout, "a long-lived stream (a CheckStream, a peer's ForwardStream, an Envoy's quota stream) whose answer has waited this long for its client to read it is ended, freeing its slot, and its client's connection closed")
	fs.DurationVar(&c.RequestTimeout, "request-timeout", d.RequestTimeout, "longest a gRPC call on the client port (other than a stream) may take, its message included, unless its client asks for less: a client that withholds its message holds a slot of --max-inflight until then; on the RESP port, the decision of each batch of commands")
	fs.DurationVar(&c.StreamIdleTimeout, "stream-idle-timeout", d.StreamIdleTimeout, "a CheckStream or a peer's ForwardStream without requests for this long is ended, its slot given back; halfway its client is asked to end it (the Go client and the nodes do at once, sending single RPCs for 5s, then opening a new stream); an Envoy's quota stream without a report for this long is ended (Envoy reports every reporting_interval: keep this several of them)")
	fs.StringVar(&c.MemoryLimit, "memory-limit", "", "the node's memory bound, e.g. 512MiB: the Go runtime's soft memory limit, and what the node's counters (30%), replicas (10%) and client requests in flight (25%) are held within, beyond which it refuses new requests (docs/operations.md) (default: GOMEMLIMIT if set, else 90% of the container's memory limit)")
	fs.IntVar(&c.MaxLogEntries, "max-log-entries", d.MaxLogEntries, "entries of all SLIDING_LOG counters held, 16 bytes each; beyond it logs back to full are evicted, and when none is the hit that would grow a log is refused")
	fs.IntVar(&c.MaxReservations, "max-reservations", d.MaxReservations, "reservations (checks with reserve_ttl_ms) this node holds as keys' owner, open or settled until their time-to-live, 272 bytes each (27 MB at the default), and at most an eighth of the counters' share of --memory-limit; beyond it reservations are refused UNAVAILABLE and counted")
	fs.IntVar(&c.MaxReservationsPerKey, "max-reservations-per-key", limiter.DefaultMaxReservationsPerKey, "reservations one name and key hold, open or settled until their time-to-live, at most --max-reservations, so that one client cannot take them all; beyond it that key's reservations are refused UNAVAILABLE and counted")
	fs.IntVar(&c.MaxReservationsPerClient, "max-reservations-per-client", limiter.DefaultMaxReservationsPerClient, "reservations one client (the name of its verified TLS certificate, else its source /24 or /64) makes through this node, open or settled until their time-to-live, so that one client cannot take --max-reservations; beyond it its reservations are refused UNAVAILABLE")
	fs.StringVar(&c.SnapshotDir, "snapshot-dir", "", "directory for this node's counters, written every --snapshot-interval and at shutdown, loaded at start: they survive a stop of the whole cluster (none: counters live in memory only)")
	fs.DurationVar(&c.SnapshotInterval, "snapshot-interval", d.SnapshotInterval, "how often the counters are written to --snapshot-dir: a node killed without its shutdown (SIGKILL, power loss) comes back with its counters as they were at most this long before")
	fs.IntVar(&c.MaxInflight, "max-inflight", d.MaxInflight, "client requests (HTTP checks and settles, gRPC calls and the requests of CheckStreams) in flight at once; beyond it they are refused at once, HTTP 503 or gRPC RESOURCE_EXHAUSTED")
	fs.IntVar(&c.MaxStreams, "max-streams", d.MaxStreams, "CheckStream streams open at once (a Go client keeps one to each node); beyond it new ones are refused with RESOURCE_EXHAUSTED, and their clients use Check RPCs")
	fs.DurationVar(&c.Leases.TTL, "lease-ttl", d.Leases.TTL, "how long a grant lent to a lessee (a leased Go client) lives without a report; the lessee stops using it after three quarters of it (docs/leases.md)")
	fs.IntVar(&c.Leases.MaxLessees, "max-lessees", d.Leases.MaxLessees, "lessees holding accounts of keys this node owns; a report that would open an account beyond it is answered UNAVAILABLE")
	fs.IntVar(&c.Leases.MaxLeasesPerKey, "max-leases-per-key", d.Leases.MaxLeasesPerKey, "lessees' accounts of one key")
	fs.IntVar(&c.Leases.MaxKeysPerLessee, "max-keys-per-lessee", d.Leases.MaxKeysPerLessee, "one lessee's accounts of keys this node owns")
	fs.IntVar(&c.RLQS.MaxStreams, "rlqs-max-streams", d.RLQS.MaxStreams, "Envoy rate limit quota streams open on this node; a stream beyond it is refused RESOURCE_EXHAUSTED (docs/rlqs.md)")
	fs.IntVar(&c.RLQS.MaxBucketsPerStream, "rlqs-max-buckets-per-stream", d.RLQS.MaxBucketsPerStream, "buckets of one quota stream (at most 1000); reports of further buckets are ignored, and Envoy applies its no_assignment_behavior to them")
	fs.DurationVar(&c.RLQS.AssignmentTTL, "rlqs-assignment-ttl", d.RLQS.AssignmentTTL, "time-to-live of a quota assignment, whole seconds, at most --lease-ttl less 1s; renewed every half of it")
	fs.IntVar(&c.RLQS.AbandonAfter, "rlqs-abandon-after", d.RLQS.AbandonAfter, "reports in a row without a request after which a quota bucket is abandoned (AbandonAction)")
	fs.StringVar(&c.PeerTLS.Cert, "peer-tls-cert", "", "PEM certificate for the peer port, valid for --node-name, from the cluster CA; reloaded on change")
	fs.StringVar(&c.PeerTLS.Key, "peer-tls-key", "", "PEM key of --peer-tls-cert")
	fs.StringVar(&c.PeerTLS.CA, "peer-tls-ca", "", "PEM cluster CA: peers must present a certificate from it (mutual TLS)")
	fs.StringVar(&c.MemberNames, "member-names", "", "pattern every member's name must match, dot-separated labels each a glob whose * stays within its label (rlnode-*.rlnode.ns.svc.cluster.local): a node of another name is not admitted to the ring, so other certificates of the cluster CA make no members")
	fs.StringVar(&c.TLS.Cert, "tls-cert", "", "PEM certificate for TLS on the HTTP, gRPC and RESP ports; reloaded on change")
	fs.StringVar(&c.TLS.Key, "tls-key", "", "PEM key of --tls-cert")
	fs.StringVar(&c.TLS.CA, "tls-client-ca", "", "PEM CA: clients of the HTTP, gRPC and RESP ports must present a certificate from it")
	fs.BoolVar(&c.StatusPage, "status-page", d.StatusPage, "serve the status page on the HTTP port, GET /status and GET /: members, checks/s, replication lag, the hottest and most refused keys, ring changes (GET /v1/top is served either way)")
	fs.BoolVar(&c.HideKeys, "status-hide-keys", false, "show keys on the status page and in GET /v1/top only as keyed hashes, for privacy")
	fs.DurationVar(&c.Top.Window, "top-window", d.Top.Window, "interval of the counts of who is being limited (GET /v1/top, rlnode top, the status page): each report covers the last one to two")
	// Read as a string and parsed below, so that no error message repeats
	// a key.
	fs.StringVar(&c.gossipKey, "gossip-key", "", "base64 keys of 16, 24 or 32 bytes, comma-separated, for encrypted gossip; the first encrypts, all decrypt")
	return fs
}

// flagGroup is a group of serving flags in rlnode help flags and
// docs/flags.md, in the order of its value.
type flagGroup int

const (
	groupOther flagGroup = iota // a flag not in flagPlaces: listed last
	groupServing
	groupCluster
	groupSecurity
	groupStorage
	groupLimits
)

// title is the group's heading in the help.
func (g flagGroup) title() string {
	return [...]string{
		groupOther:    "Other",
		groupServing:  "Serving: the ports, and what a client may hold on them",
		groupCluster:  "Cluster: membership, forwarding, replication",
		groupSecurity: "Security: TLS, the gossip key, who may be a member",
		groupStorage:  "Storage: counters in memory and on disk",
		groupLimits:   "Limits: policies, strict mode, leases, Envoy's quota streams",
	}[g]
}

// flagPlace is where the help shows a serving flag: its group, and, for
// the flags a user sets first, the few words rlnode --help gives it
// (empty: the flag is listed by rlnode help flags only).
type flagPlace struct {
	group flagGroup
	front string
}

// flagPlaces places each serving flag in the help. A flag added to flags
// and not here is still listed, under Other; give it its group here.
func flagPlaces() map[string]flagPlace {
	return map[string]flagPlace{
		"http-addr":            {groupServing, "HTTP: POST /v1/check, /metrics, /status"},
		"grpc-addr":            {groupServing, "gRPC: checks, Envoy's rate limit and quotas"},
		"resp-addr":            {groupServing, "Redis protocol, CL.THROTTLE, RL.CHECK (none: off)"},
		"log-level":            {groupServing, ""},
		"status-page":          {groupServing, ""},
		"status-hide-keys":     {groupServing, ""},
		"top-window":           {groupServing, ""},
		"shutdown-timeout":     {groupServing, ""},
		"max-conns":            {groupServing, ""},
		"max-conns-per-source": {groupServing, ""},
		"handshake-timeout":    {groupServing, ""},
		"idle-timeout":         {groupServing, ""},
		"request-timeout":      {groupServing, ""},
		"stream-send-timeout":  {groupServing, ""},
		"stream-idle-timeout":  {groupServing, ""},
		"max-inflight":         {groupServing, ""},
		"max-streams":          {groupServing, ""},

		"join":               {groupCluster, "gossip addresses of members to join through"},
		"bootstrap":          {groupCluster, "the node that may start a new cluster alone"},
		"reconnect-interval": {groupCluster, ""},
		"reconnect-timeout":  {groupCluster, ""},
		"node-name":          {groupCluster, "unique member name (default: the host name)"},
		"advertise-addr":     {groupCluster, "address other nodes reach this one at"},
		"peer-addr":          {groupCluster, "gRPC between nodes only"},
		"gossip-addr":        {groupCluster, "memberlist gossip, TCP and UDP"},
		"batch-wait":         {groupCluster, ""},
		"batch-limit":        {groupCluster, ""},
		"global-sync":        {groupCluster, ""},
		"handoff-wait":       {groupCluster, ""},
		"replicate-interval": {groupCluster, ""},

		"tls-cert":      {groupSecurity, "TLS on HTTP, gRPC and RESP, with --tls-key"},
		"tls-key":       {groupSecurity, ""},
		"tls-client-ca": {groupSecurity, ""},
		"peer-tls-cert": {groupSecurity, "mutual TLS between nodes, with --peer-tls-key"},
		"peer-tls-key":  {groupSecurity, ""},
		"peer-tls-ca":   {groupSecurity, "the cluster CA that peers' certificates are from"},
		"gossip-key":    {groupSecurity, "base64 keys that encrypt gossip"},
		"member-names":  {groupSecurity, ""},

		"memory-limit":                {groupStorage, "the node's memory bound, e.g. 512MiB"},
		"snapshot-dir":                {groupStorage, "counters survive a stop of the whole cluster"},
		"snapshot-interval":           {groupStorage, ""},
		"max-keys":                    {groupStorage, ""},
		"max-log-entries":             {groupStorage, ""},
		"max-reservations":            {groupStorage, ""},
		"max-reservations-per-key":    {groupStorage, ""},
		"max-reservations-per-client": {groupStorage, ""},

		"policy-file":                 {groupLimits, "YAML policies, envoyproxy/ratelimit's format"},
		"strict-quorum":               {groupLimits, "never over a limit: members a node must see"},
		"strict-fence":                {groupLimits, ""},
		"max-clock-skew":              {groupLimits, ""},
		"lease-ttl":                   {groupLimits, ""},
		"max-lessees":                 {groupLimits, ""},
		"max-leases-per-key":          {groupLimits, ""},
		"max-keys-per-lessee":         {groupLimits, ""},
		"rlqs-max-streams":            {groupLimits, ""},
		"rlqs-max-buckets-per-stream": {groupLimits, ""},
		"rlqs-assignment-ttl":         {groupLimits, ""},
		"rlqs-abandon-after":          {groupLimits, ""},
	}
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
	case c.Leases.TTL < 4*c.GlobalSync:
		return fmt.Errorf("--lease-ttl: must be at least 4 × --global-sync (%v), so that lessees renew a grant several times in its life; got %v", 4*c.GlobalSync, c.Leases.TTL)
	case c.Leases.MaxLessees <= 0 || c.Leases.MaxLeasesPerKey <= 0 || c.Leases.MaxKeysPerLessee <= 0:
		return fmt.Errorf("--max-lessees, --max-leases-per-key, --max-keys-per-lessee: must be positive, got %d, %d, %d",
			c.Leases.MaxLessees, c.Leases.MaxLeasesPerKey, c.Leases.MaxKeysPerLessee)
	case c.MaxClockSkew < 0:
		return fmt.Errorf("--max-clock-skew: must not be negative, got %v", c.MaxClockSkew)
	case c.HandOffWait < 0 || c.HandOffWait >= peer.DefaultTimeout:
		return fmt.Errorf("--handoff-wait: must be at least 0 and under the forward deadline (%v), so that a forwarded check is answered before its sender gives up; got %v", peer.DefaultTimeout, c.HandOffWait)
	case c.StrictQuorum < 0:
		return fmt.Errorf("--strict-quorum: must not be negative (0 turns strict mode off), got %d", c.StrictQuorum)
	case c.StrictQuorum > 0 && c.StrictFence <= c.Leases.TTL+strict.EscrowTTL(c.GlobalSync):
		return fmt.Errorf("--strict-fence: must exceed --lease-ttl (%v) and the escrow's time-to-live (%v: 10 × --global-sync, at least 1s) together, so that no escrow outlives it; got %v",
			c.Leases.TTL, strict.EscrowTTL(c.GlobalSync), c.StrictFence)
	case c.ReplicateInterval < 0:
		return fmt.Errorf("--replicate-interval: must not be negative (0 turns replication off), got %v", c.ReplicateInterval)
	case c.SnapshotInterval <= 0:
		return fmt.Errorf("--snapshot-interval: must be positive, got %v", c.SnapshotInterval)
	case c.ShutdownTimeout <= 0:
		return fmt.Errorf("--shutdown-timeout: must be positive, got %v", c.ShutdownTimeout)
	case c.MaxLogEntries < algorithms.MaxSlidingLogLimit:
		return fmt.Errorf("--max-log-entries: must hold one full log, %d, got %d", algorithms.MaxSlidingLogLimit, c.MaxLogEntries)
	case c.MaxReservations <= 0:
		return fmt.Errorf("--max-reservations: must be positive, got %d", c.MaxReservations)
	case c.MaxReservationsPerClient <= 0:
		return fmt.Errorf("--max-reservations-per-client: must be positive, got %d", c.MaxReservationsPerClient)
	case c.MaxReservationsPerKey <= 0 || c.MaxReservationsPerKey > c.MaxReservations:
		return fmt.Errorf("--max-reservations-per-key: must be from 1 to --max-reservations (%d), got %d", c.MaxReservations, c.MaxReservationsPerKey)
	case c.MaxConns <= 0:
		return fmt.Errorf("--max-conns: must be positive, got %d", c.MaxConns)
	case c.MaxConnsPerSource < 0:
		return fmt.Errorf("--max-conns-per-source: must not be negative (0: no bound), got %d", c.MaxConnsPerSource)
	case c.HandshakeTimeout <= 0:
		return fmt.Errorf("--handshake-timeout: must be positive, got %v", c.HandshakeTimeout)
	case c.IdleTimeout <= 0:
		return fmt.Errorf("--idle-timeout: must be positive, got %v", c.IdleTimeout)
	case c.StreamSendTimeout <= 0:
		return fmt.Errorf("--stream-send-timeout: must be positive, got %v", c.StreamSendTimeout)
	case c.StreamIdleTimeout <= 0:
		return fmt.Errorf("--stream-idle-timeout: must be positive, got %v", c.StreamIdleTimeout)
	case c.RequestTimeout <= 0:
		return fmt.Errorf("--request-timeout: must be positive, got %v", c.RequestTimeout)
	case c.MaxInflight <= 0:
		return fmt.Errorf("--max-inflight: must be positive, got %d", c.MaxInflight)
	case c.MaxStreams <= 0:
		return fmt.Errorf("--max-streams: must be positive, got %d", c.MaxStreams)
	case c.Top.Window <= 0:
		return fmt.Errorf("--top-window: must be positive, got %v", c.Top.Window)
	case c.RLQS.Check() != nil:
		return c.RLQS.Check()
	case c.NodeName == "":
		return errors.New("--node-name: must not be empty")
	case c.ReconnectInterval <= 0:
		return fmt.Errorf("--reconnect-interval: must be positive, got %v", c.ReconnectInterval)
	case c.ReconnectTimeout <= 0:
		return fmt.Errorf("--reconnect-timeout: must be positive, got %v", c.ReconnectTimeout)
	case c.Bootstrap != "" && c.Bootstrap != c.NodeName && len(c.Join) == 0:
		return fmt.Errorf("--bootstrap: names %q, not this node (%q), which has no --join to find it through: give this node --join", c.Bootstrap, c.NodeName)
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

// loopbackUsage ends the usage of each address flag: protect's rule.
const loopbackUsage = "; given no address, and the port's own security not configured (client TLS for HTTP and gRPC, peer TLS for the peer port, a gossip key for gossip), on 127.0.0.1 only"

// protect is rlnode's protected mode, as Redis has one: a port given no
// address (flag or variable) whose own security is not configured listens
// on 127.0.0.1 only, so that a start is not open to its network on a port
// nothing protects. Each port's security opens that port alone: client
// TLS the HTTP and gRPC ports, peer TLS the peer port, a gossip key
// gossip. An address given is honoured as given. A peer or gossip port on
// loopback while the rest of the settings reach other hosts is an error,
// naming the flags that fix it: the nodes it joins would dial their own
// loopback. See docs/design-ports.md, "Protected mode".
func (c *Config) protect(given map[string]bool) error {
	clientTLS, peerTLS, gossipKey := c.TLS != (tlsfiles.Files{}), c.PeerTLS != (tlsfiles.Files{}), len(c.GossipKeys) > 0
	open := map[string]bool{"http-addr": clientTLS, "grpc-addr": clientTLS, "peer-addr": peerTLS, "gossip-addr": gossipKey}
	for _, a := range []struct {
		flag string
		addr *string
	}{{"http-addr", &c.HTTPAddr}, {"grpc-addr", &c.GRPCAddr}, {"peer-addr", &c.PeerAddr}, {"gossip-addr", &c.GossipAddr}} {
		if given[a.flag] || open[a.flag] {
			continue
		}
		_, port, err := net.SplitHostPort(*a.addr)
		if err != nil {
			return fmt.Errorf("--%s: %w", a.flag, err) // a default without a port: a bug here
		}
		*a.addr = net.JoinHostPort("127.0.0.1", port)
		c.loopback = append(c.loopback, fmt.Sprintf("--%s=%s", a.flag, *a.addr))
	}
	peerWide, gossipWide := given["peer-addr"] || peerTLS, given["gossip-addr"] || gossipKey
	if peerWide && gossipWide {
		return nil
	}
	var wide string
	switch {
	case c.AdvertiseAddr != "" && !loopbackHost(c.AdvertiseAddr):
		wide = "--advertise-addr " + c.AdvertiseAddr
	case peerWide && !loopbackHost(c.PeerAddr):
		wide = "--peer-addr " + c.PeerAddr
	case gossipWide && !loopbackHost(c.GossipAddr):
		wide = "--gossip-addr " + c.GossipAddr
	default:
		for _, j := range c.Join {
			if !loopbackHost(j) {
				wide = "--join " + j
				break
			}
		}
	}
	if wide == "" {
		return nil
	}
	return fmt.Errorf("%s reaches other hosts, but without peer TLS or a gossip key configured the peer or gossip port given no address "+
		"listen on 127.0.0.1 only, where other nodes cannot reach this one: give --peer-addr and --gossip-addr (e.g. :8082 and :7946), "+
		"or configure peer TLS (--peer-tls-cert, --peer-tls-key, --peer-tls-ca) and a gossip key (--gossip-key)", wide)
}

// loopbackHost reports whether addr, a host or host:port, names this host
// only: localhost or a loopback IP. An empty host (all interfaces) does
// not.
func loopbackHost(addr string) bool {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loopbackNote is the message a node in protected mode logs at start,
// with c.loopback beside it.
const loopbackNote = "listening on loopback only: these ports were given no address and their own security is not configured; " +
	"to serve other hosts, give each address (e.g. --http-addr :8080 or RLNODE_HTTP_ADDR=:8080), " +
	"or configure its security: client TLS (--tls-cert, --tls-key) for HTTP and gRPC, peer TLS (--peer-tls-cert, ...) for the peer port, " +
	"a gossip key (--gossip-key) for gossip"
