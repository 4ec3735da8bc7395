// Package node is one ringlimit node's life: it builds the node's parts
// in their order (listeners, TLS, policies, counter stores, snapshots,
// the peer pool, gossip membership, the service that decides checks, the
// admission gate, and the HTTP, gRPC and peer servers), runs them
// together, and when asked to stop, leaves the cluster in one ordered
// sequence of steps (see Node.leave): stop taking checks, hand counters
// to their new owners, leave gossip, flush GLOBAL hits, close the peers.
//
// The parts themselves live in their own packages; this one knows only
// how they are wired and in which order they start and stop. cmd/rlnode
// turns flags and environment variables into a Config and calls New and
// Run; tests do the same with ports set to 0.
package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"slices"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/cluster"
	"github.com/ringlimit/ringlimit/global"
	"github.com/ringlimit/ringlimit/internal/admit"
	"github.com/ringlimit/ringlimit/internal/clients"
	"github.com/ringlimit/ringlimit/internal/conns"
	"github.com/ringlimit/ringlimit/internal/nodeport"
	"github.com/ringlimit/ringlimit/internal/tlsfiles"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/policy"
	"github.com/ringlimit/ringlimit/replica"
	"github.com/ringlimit/ringlimit/resp"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/rlqs"
	"github.com/ringlimit/ringlimit/rls"
	"github.com/ringlimit/ringlimit/service"
	"github.com/ringlimit/ringlimit/snapshot"
	"github.com/ringlimit/ringlimit/status"
	"github.com/ringlimit/ringlimit/strict"
	"github.com/ringlimit/ringlimit/top"
)

// Config is every setting of a node. cmd/rlnode fills it from its flags
// (each field is the flag of the same name: HTTPAddr is --http-addr) and
// checks it, naming the flags; New takes it as given. Start from
// DefaultConfig: fields whose zero value means something say so, the
// others need a value.
type Config struct {
	// HTTPAddr, GRPCAddr and PeerAddr are the host:port of the HTTP, the
	// client gRPC and the peer gRPC listeners, as net.Listen takes them;
	// port 0 means one chosen by the kernel (see Node.HTTPAddr).
	HTTPAddr string
	GRPCAddr string
	PeerAddr string
	// RESPAddr is the host:port of the Redis protocol's listener (package
	// resp); empty means none. It has the TLS, the connection bounds and
	// the timeouts of the HTTP port.
	RESPAddr string
	// GossipAddr is memberlist's bind address, TCP and UDP.
	GossipAddr string
	// AdvertiseAddr is the address other nodes reach this one at; empty
	// means the IP gossip is bound to or, when bound to all interfaces, a
	// private IP (see cluster.Config.AdvertiseAddr).
	AdvertiseAddr string
	// Join lists the nodes to join through; nil means running alone until
	// another node joins this one.
	Join     []string
	NodeName string
	// Bootstrap names the node that may start a new cluster alone: given
	// Join, this node is ready alone when no other node answers only if
	// Bootstrap is its NodeName (see cluster.Config.Bootstrap). Empty:
	// none may.
	Bootstrap string
	// ReconnectInterval and ReconnectTimeout are how often, and for how
	// long after they went, members that were declared dead or left are
	// joined again (see cluster.Config.ReconnectInterval).
	ReconnectInterval time.Duration
	ReconnectTimeout  time.Duration
	// MaxKeys bounds the counters of each store, this node's own and the
	// replicas it keeps of others'; MaxLogEntries bounds the entries of
	// their SLIDING_LOG counters.
	MaxKeys       int
	MaxLogEntries int
	// MemoryLimit, in bytes, bounds what the node holds, in the shares
	// of memory.go: its counters, its replicas and the client requests in
	// flight, each refused beyond its share; zero means only the counts
	// above bound them. cmd/rlnode sets it to the Go runtime's soft
	// memory limit (--memory-limit, GOMEMLIMIT or 90% of the container's).
	MemoryLimit int64
	// MaxReservations bounds the reservations this node's store holds,
	// open or settled (see limiter.Config.MaxReservations).
	MaxReservations int
	// MaxReservationsPerKey bounds the reservations of one name and key
	// (see limiter.Config.MaxReservationsPerKey); zero means its default.
	MaxReservationsPerKey int
	// MaxReservationsPerClient bounds the reservations one client makes
	// through this node (see reserve.ClientReservations); zero means
	// limiter.DefaultMaxReservationsPerClient.
	MaxReservationsPerClient int
	// BatchWait and BatchLimit shape the batches of forwarded checks (see
	// peer.Config).
	BatchWait  time.Duration
	BatchLimit int
	// GlobalSync is the GLOBAL report and broadcast interval.
	GlobalSync time.Duration
	// PolicyFile is a policy file or directory (see package policy); empty
	// means none, and checks that name a policy are invalid.
	PolicyFile   string
	MaxClockSkew time.Duration
	// ShutdownTimeout bounds leaving: every step but the final snapshot's
	// write runs within it.
	ShutdownTimeout time.Duration
	// HandOffWait bounds how long a check for a key this node has just
	// come to own waits for its counter; zero means never.
	HandOffWait time.Duration
	// ReplicateInterval is how often changed counters go to their heirs;
	// zero means no replication.
	ReplicateInterval time.Duration
	// StrictQuorum, if positive, turns strict mode on, and StrictFence
	// is its fence (service.Config).
	StrictQuorum int
	StrictFence  time.Duration
	// MaxInflight bounds client requests in flight, MaxStreams the
	// CheckStreams open, and MaxConns the connections open on each of the
	// HTTP, gRPC, peer and RESP listeners, MaxConnsPerSource those from
	// one IP address on each, and the shares derived from it (zero: no
	// bound per source or range; see connConfig).
	MaxInflight       int
	MaxStreams        int
	MaxConns          int
	MaxConnsPerSource int
	// HandshakeTimeout bounds the TLS and HTTP/2 handshakes of a
	// connection to the HTTP, gRPC, peer and RESP ports, and the headers
	// of an HTTP request; a connection that has made no request (an HTTP
	// request, a gRPC call, a RESP command) that long after it was
	// accepted is closed (see connConfig). IdleTimeout closes a
	// connection that has carried no request for that long.
	// StreamSendTimeout ends a long-lived stream (a CheckStream, a peer's
	// ForwardStream, an Envoy's quota stream) whose answer has waited that
	// long for its client to read it, and StreamIdleTimeout ends one
	// without requests for that long, a CheckStream or ForwardStream
	// asked to end halfway (see mux.Server), a quota stream without a
	// report (see rlqs.Server). Zero timeouts mean none.
	HandshakeTimeout  time.Duration
	IdleTimeout       time.Duration
	StreamSendTimeout time.Duration
	StreamIdleTimeout time.Duration
	// RequestTimeout bounds a unary RPC on the client port whose client
	// gave no shorter deadline, its message included (see clientTap).
	RequestTimeout time.Duration
	// SnapshotDir is where the counters are written every
	// SnapshotInterval and at shutdown, and loaded from at start; empty
	// means counters live in memory only.
	SnapshotDir      string
	SnapshotInterval time.Duration
	// PeerTLS is mutual TLS on the peer port; TLS is TLS on the HTTP and
	// gRPC ports. Empty files mean plaintext.
	PeerTLS tlsfiles.Files
	TLS     tlsfiles.Files
	// MemberNames, if not empty, is the pattern every member's name must
	// match (dot-separated labels, each a path.Match pattern, a * never
	// crossing a dot: "rlnode-*.rlnode.ns.svc.cluster.local"): a node of
	// another name is not admitted to the ring whatever certificate it
	// holds, so that other certificates the cluster CA issued cannot make
	// members. Empty admits any name (with peer TLS, any that the
	// member's certificate names).
	MemberNames string
	// GossipKeys encrypt gossip; the first encrypts, all decrypt. Nil
	// means plaintext gossip.
	GossipKeys [][]byte
	// Leases bounds the lessees' accounts of the keys this node owns
	// (see docs/leases.md).
	Leases global.LeaseConfig
	// RLQS bounds Envoy's rate limit quota streams (see package rlqs).
	RLQS rlqs.Bounds
	// Top sizes the counts of who is being limited (package top), which
	// GET /v1/top merges across the cluster. StatusPage serves the status
	// page (package status) on the HTTP port, and HideKeys shows keys in
	// both only as keyed hashes.
	Top                  top.Config
	StatusPage, HideKeys bool
}

// DefaultConfig is the Config of `rlnode` run without flags, but for its
// name, which is the host's, and protected mode (cmd/rlnode moves the
// ports given no address to loopback when no security is configured).
// The flags' defaults come from it.
func DefaultConfig() Config {
	return Config{
		HTTPAddr:          nodeport.DefaultHTTPAddr,
		GRPCAddr:          nodeport.DefaultGRPCAddr,
		PeerAddr:          ":8082",
		GossipAddr:        cluster.DefaultBindAddr,
		ReconnectInterval: cluster.DefaultReconnectInterval,
		ReconnectTimeout:  cluster.DefaultReconnectTimeout,
		MaxKeys:           limiter.DefaultMaxKeys,
		MaxLogEntries:     limiter.DefaultMaxLogEntries,
		MaxReservations:   limiter.DefaultMaxReservations,
		BatchWait:         500 * time.Microsecond,
		BatchLimit:        1000,
		GlobalSync:        100 * time.Millisecond,
		MaxClockSkew:      service.DefaultMaxClockSkew,
		ShutdownTimeout:   30 * time.Second,
		HandOffWait:       time.Second,
		ReplicateInterval: replica.DefaultInterval,
		StrictFence:       strict.DefaultFence,
		MaxInflight:       admit.DefaultMax,
		MaxStreams:        admit.DefaultMaxStreams,
		MaxConns:          DefaultMaxConns,
		MaxConnsPerSource: DefaultMaxConnsPerSource,
		HandshakeTimeout:  DefaultHandshakeTimeout,
		IdleTimeout:       DefaultIdleTimeout,
		StreamSendTimeout: DefaultStreamSendTimeout,
		StreamIdleTimeout: DefaultStreamIdleTimeout,
		RequestTimeout:    DefaultRequestTimeout,
		SnapshotInterval:  snapshot.DefaultInterval,
		Leases: global.LeaseConfig{TTL: global.DefaultLeaseTTL, MaxLessees: global.DefaultMaxLessees,
			MaxLeasesPerKey: global.DefaultMaxLeasesPerKey, MaxKeysPerLessee: global.DefaultMaxKeysPerLessee},
		RLQS:       rlqs.DefaultBounds(),
		Top:        top.Config{Window: top.DefaultWindow},
		StatusPage: true,
	}
}

// Node is one node's parts, built by New and run by Run.
type Node struct {
	conf Config
	log  *slog.Logger
	lis  listeners

	policies *policy.Reloader
	snaps    *snapshots
	pool     *peer.Pool
	members  *cluster.Cluster
	svc      *service.Service
	faces    *api.Server
	quotas   *rlqs.Server
	unknown  *policy.UnknownDomains // domains Envoy asks for that no policy file has
	health   *health.Server
	grpcSrv  *grpc.Server
	peerSrv  *grpc.Server
	peerFace *peer.Server
	httpSrv  *http.Server
	// top counts who is being limited, and changes logs the ring's
	// changes, for GET /v1/top and the status page.
	top     *top.Tracker
	changes *status.Changes
	respSrv *resp.Server // nil without --resp-addr
	// ringChanged is signalled by the cluster on every ring change; the
	// service loop reacts to it, so that nothing is wired to a part
	// before the part exists.
	ringChanged chan struct{}
	// insecure says what leaves the node open, or is empty.
	insecure string
	// ownName checks that the node's peer certificate names it (see
	// transport.ownName).
	ownName func() error
}

// New opens the node's listeners, so that a port conflict fails at once
// and ports chosen by the kernel are known (see HTTPAddr), loads its TLS
// files and policies, and builds its parts. It starts nothing; Run does,
// and closes the listeners when it returns.
func New(conf Config, log *slog.Logger) (_ *Node, err error) {
	n := &Node{conf: conf, log: log, ringChanged: make(chan struct{}, 1), insecure: conf.insecure()}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	lis, err := listen(conf)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lis.close()
		}
	}()
	n.lis = lis.limit(conf, conns.NewMetrics(reg), n.memberAddr)

	tr, err := newTransport(conf, log, n.membersAt)
	if err != nil {
		return nil, err
	}
	n.ownName = func() error { return tr.ownName(conf.NodeName) }
	if n.policies, err = loadPolicies(conf.PolicyFile, log, reg); err != nil {
		return nil, err
	}
	mem := splitMemory(conf.MemoryLimit, conf)
	own := mem.counters
	own.Registerer = reg
	own.MaxReservationsPerKey = conf.MaxReservationsPerKey
	store := limiter.New(own)
	// Replicas of other owners' counters are kept apart, under the same
	// counts and a share of their own (package replica exports their
	// metrics).
	// They hold the reservations of their counters, within the same
	// --max-reservations (see limiter/travel.go).
	replicas := limiter.New(mem.replicas)
	if n.snaps, err = openSnapshots(conf, store, log, reg); err != nil {
		return nil, err
	}
	n.pool = peer.NewPool(peer.Config{BatchWait: conf.BatchWait, BatchLimit: conf.BatchLimit, Registerer: reg, DialOptions: tr.peerDial, Name: conf.NodeName})
	defer func() {
		if err != nil {
			n.pool.Close()
		}
	}()
	n.members, err = cluster.New(cluster.Config{
		NodeName:          conf.NodeName,
		BindAddr:          conf.GossipAddr,
		AdvertiseAddr:     conf.AdvertiseAddr,
		Join:              conf.Join,
		Bootstrap:         conf.Bootstrap != "" && conf.Bootstrap == conf.NodeName,
		ReconnectInterval: conf.ReconnectInterval,
		ReconnectTimeout:  conf.ReconnectTimeout,
		Keys:              conf.GossipKeys,
		PeerAddr:          n.lis.peer.Addr().String(),
		GRPCAddr:          n.lis.grpc.Addr().String(),
		HTTPAddr:          n.lis.http.Addr().String(),
		Admit:             tr.admitFunc(),
		Logger:            log,
		Registerer:        reg,
		OnChange: func(_, _ *ring.Ring) {
			select {
			case n.ringChanged <- struct{}{}:
			default: // a change is pending already; the loop reads the newest ring
			}
		},
	})
	if err != nil {
		return nil, err
	}
	n.top = top.New(conf.Top, time.Now())
	n.changes = &status.Changes{}
	n.unknown = policy.NewUnknownDomains(log, reg)
	leases := conf.Leases
	leases.MaxAccounts = mem.leaseAccounts
	perClient := clients.NewQuota(cmp.Or(conf.MaxReservationsPerClient, limiter.DefaultMaxReservationsPerClient))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "ringlimit_reservations_refused_per_client_total",
		Help: "Reservations refused because their client (its TLS name, or its /24 or /64) held --max-reservations-per-client through this node.",
	}, func() float64 { return float64(perClient.Refused()) }))
	n.svc = service.New(service.Config{
		Store: store, Replicas: replicas, Cluster: n.members, Peers: n.pool,
		MaxClockSkew: conf.MaxClockSkew, GlobalSync: conf.GlobalSync, HandOffWait: conf.HandOffWait,
		ReplicateInterval: conf.ReplicateInterval, HandedOff: n.snaps.handedOff(),
		StrictQuorum: conf.StrictQuorum, StrictFence: conf.StrictFence,
		Logger: log, Registerer: reg, Policies: n.policies, Leases: leases, Top: n.top,
		Clients: perClient,
	})
	// Every long-lived stream, on the client port and the peer port, is
	// bounded by the same two timeouts (see docs/security.md, "Connection and
	// stream slots").
	ended := newStreamsEnded(reg)
	grpcLis := n.lis.grpc.(*conns.Listener)
	gate := admit.New(admit.Config{Max: conf.MaxInflight, Streams: []string{api.CheckStreamMethod}, MaxStreams: conf.MaxStreams,
		Pools:    map[string]int{rlqs.Method: conf.RLQS.MaxStreams},
		MaxBytes: mem.requests, MaxBodyBytes: api.MaxBodyBytes, CallBytes: admit.ArrivalBytes(api.MaxRecvMsgBytes), Registerer: reg})
	n.faces = api.New(api.Config{
		Checker: n.svc, Leases: n.svc, Settler: n.svc, Registerer: reg, Gatherer: reg, Admit: gate.HTTP, AdmitMessage: gate.Message,
		Ready: n.readiness, ReadyNote: n.insecure,
		Members: func() []api.Member { return apiMembers(n.members) },
		Ring:    n.members.Ring, StreamSendTimeout: conf.StreamSendTimeout, StreamIdleTimeout: conf.StreamIdleTimeout,
		StreamEnded: ended.of("check", grpcLis), RESPPort: respPort(n.lis.resp),
	})

	// Stream workers reuse goroutines whose stacks have grown already,
	// rather than starting one per RPC. gRPC starts a goroutine for an RPC
	// that finds every worker busy, and a node has as many RPCs in flight
	// as clients wait on it (or on its owners), not as it has cores:
	// with one worker a core, most RPCs of 50 concurrent clients started
	// a goroutine and grew its stack (7% of a node's CPU). An idle worker
	// costs its stack, a few KB.
	workers := grpc.NumStreamWorkers(uint32(streamWorkersPerCore * runtime.GOMAXPROCS(0)))
	// The client port's codec refuses the 1,001st item, or descriptor,
	// before building it.
	rlsBound := api.BoundOf(&rlspb.RateLimitRequest{}, "descriptors", rls.MaxDescriptors)
	rlqsBound := api.BoundOf(&rlqspb.RateLimitQuotaUsageReports{}, "bucket_quota_usages", rlqs.MaxUsagesPerMessage)
	tap := newClientTap(gate, grpcLis, conf.RequestTimeout, api.CheckStreamMethod, rlqs.Method)
	n.grpcSrv = grpc.NewServer(slices.Concat(api.ServerOptions(rlsBound, rlqsBound), tr.grpcServer(), conf.connOptions(),
		gate.ServerOptions(), []grpc.ServerOption{workers, grpc.InTapHandle(tap.tap)})...)
	n.health = n.faces.RegisterGRPC(n.grpcSrv)
	rls.New(rls.Config{Checker: n.svc, Policies: n.policies, UnknownDomain: n.unknown.Saw}).Register(n.grpcSrv)
	if n.quotas, err = rlqs.New(rlqs.Config{Leaser: n.svc, Policies: n.policies, Bounds: conf.RLQS, LeaseTTL: conf.Leases.TTL,
		Registerer: reg, Logger: log, StreamSendTimeout: conf.StreamSendTimeout, StreamIdleTimeout: conf.StreamIdleTimeout,
		StreamEnded: ended.of("rlqs", grpcLis), MaxBytes: mem.quotas, UnknownDomain: n.unknown.Saw}); err != nil {
		return nil, err
	}
	n.quotas.Register(n.grpcSrv)
	tap.learn(n.grpcSrv)
	guard := peer.NewGuard(peer.GuardConfig{Members: n.members, Certificates: tr.peerTLS, Self: conf.NodeName, Logger: log, Registerer: reg})
	peerLis := n.lis.peer.(*conns.Listener)
	n.peerSrv = grpc.NewServer(slices.Concat(peer.ServerOptions(establishing(peerLis)), tr.peerServer, conf.connOptions(),
		[]grpc.ServerOption{workers, grpc.ChainUnaryInterceptor(guard.Unary), grpc.ChainStreamInterceptor(guard.Stream)})...)
	n.peerFace = peer.NewServer(n.svc.Owner(), reg)
	n.peerFace.BoundStreams(peer.StreamBounds{SendTimeout: conf.StreamSendTimeout, IdleTimeout: conf.StreamIdleTimeout,
		Ended: ended.of("forward", peerLis)})
	n.peerFace.Register(n.peerSrv)
	// Timeouts bound what a slow or idle client can hold: a body of
	// api.MaxBodyBytes arrives well within ReadTimeout on any link, and
	// a check needs no headers of more than a few KB. No route streams or
	// long-polls, so WriteTimeout is what answering a check can take.
	// ReadHeaderTimeout also bounds a TLS handshake. A connection that has
	// begun a request is pending no more (see package conns).
	n.httpSrv = &http.Server{Handler: n.httpHandler(), ReadHeaderTimeout: conf.HandshakeTimeout, MaxHeaderBytes: 64 << 10,
		ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: conf.IdleTimeout, TLSConfig: tr.public,
		ConnState: func(c net.Conn, s http.ConnState) {
			if s == http.StateActive {
				conns.Established(c)
			}
		}}
	if n.lis.resp != nil {
		// As on the HTTP port: the handshake and a command that has begun
		// within HandshakeTimeout, answers read within HTTP's WriteTimeout.
		n.respSrv = resp.New(resp.Config{Checker: n.svc, TLS: tr.public, HandshakeTimeout: conf.HandshakeTimeout,
			IdleTimeout: conf.IdleTimeout, WriteTimeout: 30 * time.Second, RequestTimeout: conf.RequestTimeout, Logger: log,
			Established: conns.Established, Native: n.faces})
	}
	return n, nil
}

// respPort is the port lis listens on, 0 for none: a CheckStream names
// it to the Go client (api.Config.RESPPort).
func respPort(lis net.Listener) int {
	if lis == nil {
		return 0
	}
	if a, ok := lis.Addr().(*net.TCPAddr); ok {
		return a.Port
	}
	return 0
}

// HTTPAddr, GRPCAddr and PeerAddr return the addresses the node listens
// on, with the ports the kernel chose for port 0.
func (n *Node) HTTPAddr() string { return n.lis.http.Addr().String() }
func (n *Node) GRPCAddr() string { return n.lis.grpc.Addr().String() }
func (n *Node) PeerAddr() string { return n.lis.peer.Addr().String() }

// RESPAddr returns the address of the Redis protocol's listener, or ""
// when the node has none.
func (n *Node) RESPAddr() string {
	if n.lis.resp == nil {
		return ""
	}
	return n.lis.resp.Addr().String()
}

// Cluster returns the node's membership: its ring, its members, and its
// gossip address once Run has bound it.
func (n *Node) Cluster() *cluster.Cluster { return n.members }

// Run serves until ctx ends, then leaves the cluster within
// Config.ShutdownTimeout, one step after another (see leave). A part
// that fails (a server, a background loop) ends the serving as ctx does,
// and its error is returned with those of the steps. Run is called once.
func (n *Node) Run(ctx context.Context) error {
	defer n.lis.close()
	defer n.pool.Close()
	// Before anything serves or joins: the node reports ready, and decides
	// checks, with its counters.
	n.snaps.load(ctx, n.svc.Intake())
	if ctx.Err() != nil {
		// Asked to stop while loading (SIGTERM): nothing serves or has
		// joined yet, so there is nothing to leave, and no final snapshot
		// is written, which would replace the file with the part loaded.
		n.log.Info("stopped during start-up, while loading the snapshot: nothing was served or joined", "node", n.conf.NodeName)
		return nil
	}

	g, gctx := errgroup.WithContext(ctx)
	// The background loops run until their step of leaving stops them,
	// not until ctx ends.
	parts := loops{
		gossip:  startLoop(g, n.members.Run),
		service: startLoop(g, n.runService),
		peers:   startLoop(g, n.pool.Run),
	}
	n.snaps.start(g)
	g.Go(func() error { return ignoreCanceled(n.policies.Run(gctx)) }) // policies stay in force once it stops
	g.Go(func() error { return ignoreCanceled(n.top.Run(gctx)) })
	g.Go(func() error { return serveHTTP(n.httpSrv, n.lis.http) })
	g.Go(func() error { return serveGRPC(n.grpcSrv, n.lis.grpc) })
	g.Go(func() error { return serveGRPC(n.peerSrv, n.lis.peer) })
	if n.respSrv != nil {
		g.Go(func() error { return ignoreClosed(n.respSrv.Serve(n.lis.resp)) })
	}

	if n.insecure != "" {
		n.log.Warn("INSECURE: " + n.insecure)
	}
	if open := n.conf.openMembers(); open != "" {
		n.log.Warn(open)
	}
	if err := n.ownName(); err != nil {
		n.log.Error("not ready until fixed: " + err.Error())
	}
	n.log.Info("rlnode serving", "node", n.conf.NodeName, "http", n.HTTPAddr(), "grpc", n.GRPCAddr(),
		"peer", n.PeerAddr(), "resp", n.RESPAddr(), "join", n.conf.Join)

	g.Go(func() error {
		<-gctx.Done()
		stage := "serving"
		if !n.members.Ready() {
			stage = "start-up: not joined yet" // --join answers no one yet: leaving is quick
		}
		n.log.Info("shutting down", "stage", stage, "timeout", n.conf.ShutdownTimeout)
		ctx, cancel := context.WithTimeout(context.Background(), n.conf.ShutdownTimeout)
		defer cancel()
		return n.leave(ctx, parts)
	})
	return g.Wait()
}

// runService runs the service's background work, and tells it and the
// peer pool of every ring change, until ctx ends.
func (n *Node) runService(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		n.recordRing(n.members.Ring())
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-n.ringChanged:
				r := n.members.Ring()
				n.recordRing(r)
				n.svc.RingChanged()
				n.pool.Retain(peerAddrs(r))
			}
		}
	})
	g.Go(func() error { return n.svc.Run(ctx) })
	return g.Wait()
}

// streamWorkersPerCore is how many gRPC stream workers a node keeps per
// core (grpc.NumStreamWorkers).
const streamWorkersPerCore = 32

// loadPolicies loads the policy file; without one it returns a nil
// Reloader, which holds no policies.
func loadPolicies(path string, log *slog.Logger, reg prometheus.Registerer) (*policy.Reloader, error) {
	if path == "" {
		return nil, nil
	}
	r, err := policy.NewReloader(policy.ReloaderConfig{Path: path, Logger: log, Registerer: reg})
	if err != nil {
		return nil, fmt.Errorf("--policy-file: %w", err)
	}
	return r, nil
}

func serveHTTP(srv *http.Server, lis net.Listener) error {
	serve := srv.Serve
	if srv.TLSConfig != nil {
		serve = func(l net.Listener) error { return srv.ServeTLS(l, "", "") } // the certificate comes from TLSConfig
	}
	if err := serve(lis); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http: %w", err)
	}
	return nil
}

// serveGRPC serves srv on lis until it stops. A stop that comes before
// Serve starts (SIGTERM in the first instants) makes Serve return
// grpc.ErrServerStopped: that is a stop asked for, not a failure.
func serveGRPC(srv *grpc.Server, lis net.Listener) error {
	if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// ignoreClosed is nil for the error of a RESP server that was shut down.
func ignoreClosed(err error) error {
	if errors.Is(err, resp.ErrServerClosed) {
		return nil
	}
	return err
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// stopGRPC stops srv gracefully, or at once when ctx ends first.
func stopGRPC(ctx context.Context, srv *grpc.Server) {
	stop := context.AfterFunc(ctx, srv.Stop)
	defer stop()
	srv.GracefulStop()
}

// membersAt returns the names of the members whose peer port is at addr:
// whom a connection to addr must reach. They are the admitted members,
// those that left moments ago included (a new owner may still pull a
// counter from its previous owner as it leaves).
func (n *Node) membersAt(addr string) []string {
	var names []string
	for _, m := range n.members.Members() {
		if m.PeerAddr == addr && n.members.Member(m.Name) {
			names = append(names, m.Name)
		}
	}
	return names
}

// memberAddr reports whether ip is the address of a member gossip knows
// (its gossip or peer address), admitted to the ring or not, alive or
// gone within the last minutes (cluster.Members): the peer port admits
// its connections ahead of strangers' (see connConfig). A node that
// restarts is known by the others as soon as its join reaches them,
// before they admit it, and its admission checks of them come after. The
// address is all there is before a TLS handshake, and proves nothing: a
// source that can complete TCP handshakes from a member's address gets
// that address's precedence, and no certificate (docs/security.md, "Pending
// connections, shares and members").
func (n *Node) memberAddr(ip netip.Addr) bool {
	if n.members == nil {
		return false // not built yet; nothing is accepted before
	}
	for _, m := range n.members.Members() {
		for _, a := range []string{m.GossipAddr, m.PeerAddr} {
			if ap, err := netip.ParseAddrPort(a); err == nil && ap.Addr().Unmap() == ip {
				return true
			}
		}
	}
	return false
}

func peerAddrs(r *ring.Ring) []string {
	var addrs []string
	for _, m := range r.Members() {
		addrs = append(addrs, m.PeerAddr)
	}
	return addrs
}

func apiMembers(c *cluster.Cluster) []api.Member {
	self := c.LocalMember().Name
	var out []api.Member
	for _, m := range c.Members() {
		out = append(out, api.Member{
			Name: m.Name, GossipAddr: m.GossipAddr, GRPCAddr: m.GRPCAddr, PeerAddr: m.PeerAddr, HTTPAddr: m.HTTPAddr,
			State: string(m.State), Share: m.Share, Self: m.Name == self, Admission: m.Admission,
		})
	}
	return out
}
