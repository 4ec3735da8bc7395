// Package service answers checks: it validates them, works out once per
// check which owner and which part of the node decides it (the counter
// store, package global for GLOBAL checks, or the key's owner through
// package peer), and falls back to this node's share of the limit when an
// owner cannot be reached. It also hands counters over when the ring
// changes. It orchestrates; the protocols live in their own packages. The
// gRPC and HTTP faces in package api only translate to and from it.
package service

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/borrow"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/custody"
	"github.com/ringlimit/ringlimit/global"
	"github.com/ringlimit/ringlimit/heal"
	"github.com/ringlimit/ringlimit/lease"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/reserve"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/strict"
	"github.com/ringlimit/ringlimit/top"
)

// DefaultMaxClockSkew bounds how far created_at_ms may be from the
// server clock.
const DefaultMaxClockSkew = 10 * time.Minute

// Membership is what the service needs of the cluster: the current ring,
// which member this node is, and whether it has joined the others yet
// (package cluster's Cluster.Ready).
type Membership interface {
	Ring() *ring.Ring
	LocalMember() ring.Member
	Ready() bool
	Returning() []string
}

// Peers is what the service needs of the other nodes: package peer's Pool.
// The service forwards checks, relays and pulls them (through package
// heal, which watches who answers); GLOBAL sync, leases, hand-off and
// replication (package custody) use the rest.
type Peers interface {
	heal.Peers
	global.Peers
	custody.Peers
	lease.Peers
	// Settle relays a client's settle of a reservation to the node at addr
	// (see peer.Pool.Settle).
	Settle(ctx context.Context, addr, from string, req *pb.SettleRequest) (*pb.SettleResponse, error)
}

// Config configures a Service. The zero value is a single node with a
// default store, the real clock and no metrics.
type Config struct {
	// Store holds this node's counters; nil means a store with defaults.
	Store *limiter.Store
	// Cluster places keys on owners and Peers reaches them. Nil Cluster
	// means a single node that owns every key; Peers is then unused.
	Cluster Membership
	Peers   Peers
	// MaxClockSkew bounds created_at_ms; zero means DefaultMaxClockSkew.
	MaxClockSkew time.Duration
	// GlobalSync is how often GLOBAL hits go to owners and owners
	// broadcast; zero means global.DefaultInterval.
	GlobalSync time.Duration
	// HandOffWait is how long, at most, a check for a key this node has
	// just come to own waits for the key's previous owner to hand its
	// counter over (see handoff.Node.Await); zero means checks never wait.
	HandOffWait time.Duration
	// Replicas holds the replicas this node keeps of other owners'
	// counters (see package replica); nil means a store with defaults.
	Replicas *limiter.Store
	// ReplicateInterval is how often this node sends the counters that
	// changed to the nodes that would inherit them; zero means it sends
	// none (it still keeps and promotes the replicas others send).
	ReplicateInterval time.Duration
	// Now is the server clock; nil means time.Now.
	Now func() time.Time
	// Logger receives the service's logs; nil discards them.
	Logger *slog.Logger
	// Registerer receives the service's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Policies resolves the policy field of checks; nil means none is
	// loaded, and a check naming a policy is invalid.
	Policies Policies
	// HandedOff, if not nil, is given the records of the counters other
	// nodes took from this one by hand-off (see handoff.Config.HandedOff).
	HandedOff func(records [][]byte)
	// Leases bounds the lessees' accounts of the keys this node owns (see
	// package lease); its zero fields mean their defaults.
	Leases global.LeaseConfig
	// StrictQuorum, if positive, turns strict mode on (package strict): this
	// node decides keys only while its ring holds at least this many
	// members, and never fails over. Every node of a cluster must agree.
	StrictQuorum int
	// StrictFence is how long, in strict mode, keys of a member that left
	// the ring wait before this node decides them; zero means
	// strict.DefaultFence.
	StrictFence time.Duration
	// EscrowTTL is how long, in strict mode, a GLOBAL grant is spent after
	// the owner last renewed it; zero means strict.EscrowTTL(GlobalSync).
	EscrowTTL time.Duration
	// Top, if not nil, counts every check this node decides by name and
	// key (see package top); nil counts none.
	Top *top.Tracker
	// Clients, if not nil, bounds the reservations each client makes
	// through this node (see reserve.Claims); nil bounds none.
	Clients reserve.ClientReservations
	// Holds, if not nil, is where this node looks whether it holds a
	// counter instead of Store.Holds (see custody.Config.Holds): a test
	// watches the look with it.
	Holds func(r *limiter.Request) bool
}

// Service decides checks. It is safe for concurrent use. Run drives its
// background work (GLOBAL sync, hand-off and replication); Check works
// without it, except that GLOBAL hits then stay on this node and no
// counter is replicated.
type Service struct {
	store   *limiter.Store
	cluster Membership
	peers   Peers
	skew    time.Duration
	now     func() time.Time
	log     *slog.Logger
	metrics metrics
	global  *global.Node
	leases  *lease.Node
	// custody keeps track of where each key's counter is, and answers
	// what a key needs before it is decided here (package custody).
	custody  *custody.Custody
	policies Policies
	// heal knows the owners whose last forward failed (suspects: their
	// keys fail over until a probe finds them answering), and those whose
	// keys this node decided by failover, which get their counters back
	// once they answer (package heal).
	heal *heal.Node
	// borrows decides the checks with a ceiling (package borrow).
	borrows *borrow.Node
	// reservations settles reservations (package reserve).
	reservations *reserve.Node
	// strict is strict mode, off unless Config.StrictQuorum is set.
	strict *strict.Mode
	// top counts the checks decided here by key; nil counts none.
	top *top.Tracker
	// checkPool holds slices of custody.Check for requests of many items
	// (see custodyChecks).
	checkPool sync.Pool
}

// New returns a Service. It starts nothing.
func New(conf Config) *Service {
	s := &Service{store: conf.Store, cluster: conf.Cluster, peers: conf.Peers, skew: conf.MaxClockSkew, now: conf.Now, log: conf.Logger,
		policies: conf.Policies, top: conf.Top}
	if s.store == nil {
		s.store = limiter.New(limiter.Config{})
	}
	if s.cluster == nil {
		s.cluster = newAlone()
	}
	if s.skew <= 0 {
		s.skew = DefaultMaxClockSkew
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.metrics = newMetrics(conf.Registerer)
	s.strict = strict.New(conf.StrictQuorum, conf.StrictFence)
	s.heal = heal.New(heal.Config{Peers: conf.Peers, Cluster: s.cluster, Logger: s.log, Registerer: conf.Registerer})
	var peers custody.Peers
	if conf.Peers != nil {
		peers = conf.Peers
	}
	s.custody = custody.New(custody.Config{
		Store: s.store, Replicas: conf.Replicas, Cluster: s.cluster, Peers: peers, Fence: s.strict, Watch: s.heal,
		MaxClockSkew: s.skew, HandOffWait: conf.HandOffWait, ReplicateInterval: conf.ReplicateInterval,
		HandedOff: conf.HandedOff, Holds: conf.Holds, Now: s.now, Logger: s.log, Registerer: conf.Registerer,
	})
	s.global = global.New(global.Config{
		Store: s.store, Cluster: s.cluster, Peers: conf.Peers,
		Interval: conf.GlobalSync, MaxClockSkew: s.skew, Now: s.now, Logger: s.log, Registerer: conf.Registerer,
		Inherit: s.custody.Inherit, Leases: conf.Leases,
		Escrow: s.strict.Escrow(conf.GlobalSync, conf.EscrowTTL, func() int { return s.cluster.Ring().Len() }),
	})
	s.borrows = borrow.New(borrow.Config{Store: s.store, Parents: s.global, Owners: s.heal, Registerer: conf.Registerer})
	s.reservations = reserve.New(reserve.Config{Store: s.store, Custody: s.custody, Cluster: s.cluster, Peers: conf.Peers,
		Now: s.now, Result: checks.Result, Clients: conf.Clients})
	s.leases = lease.New(lease.Config{
		Lender: s.global, Cluster: s.cluster, Peers: conf.Peers, Result: checks.Result, Now: s.now, Logger: s.log,
		MaxClockSkew: s.skew,
		Await:        s.custody.Await,
	})
	return s
}

// Intake is how counters that arrive from outside the node (hand-off,
// replicas, a snapshot) are taken into a store: checks.Intake, with this
// node's --max-clock-skew.
func (s *Service) Intake() checks.Intake {
	return checks.Intake{MaxClockSkew: s.skew}
}

// alone is the Membership of a single node: it owns every key. Its ring is
// built once: building one costs milliseconds.
type alone struct{ ring *ring.Ring }

func newAlone() alone { return alone{ring.New(alone{}.LocalMember())} }

func (a alone) Ring() *ring.Ring       { return a.ring }
func (alone) LocalMember() ring.Member { return ring.Member{Name: "self"} }
func (alone) Ready() bool              { return true }
func (alone) Returning() []string      { return nil }

// Leave is the first step of this node's leaving the cluster, before
// HandOffAll and before it leaves gossip: from now on it routes every
// check as if it had left (see custody.Custody.Leave).
func (s *Service) Leave() { s.custody.Leave() }

// Run drives the service's background work until ctx ends: GLOBAL sync
// rounds, hand-off of counters this node no longer owns, replication of
// changed counters to their heirs, probes of suspect owners, and the
// dropping of expired reservations.
// Shutdown then calls HandOff and FlushGlobal, in that order. If one of
// these loops fails, Run stops the others and returns its error, so that
// the node's owner hears of it and stops too.
func (s *Service) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.custody.Run(ctx) })
	g.Go(func() error { s.heal.Run(ctx); return nil })
	g.Go(func() error { return s.global.Run(ctx) })
	g.Go(func() error { s.reservations.Run(ctx); return nil })
	return g.Wait()
}

// RingChanged tells the service that the ring changed, so that it hands
// off the counters it no longer owns, promotes the replicas of keys it
// now owns, replicates every counter to its heir again and has failing
// connections to the members try again at once (heal). It never
// blocks.
func (s *Service) RingChanged() {
	s.strict.RingChanged(s.cluster.Ring(), s.cluster.LocalMember().Name, s.now())
	s.custody.RingChanged()
	s.heal.RingChanged()
}

// HandOff sends every counter this node holds but does not own to its
// owner now, and returns how many were taken (see custody.Custody.HandOff).
func (s *Service) HandOff(ctx context.Context) int { return s.custody.HandOff(ctx) }

// HandOffAll is the hand-off step of shutdown, after Leave: it hands off
// until every counter is taken or ctx ends, and
// returns how many were taken and how many are left, to be lost (see
// custody.Custody.HandOffAll).
func (s *Service) HandOffAll(ctx context.Context) (sent, left int) { return s.custody.HandOffAll(ctx) }

// FlushGlobal reports the GLOBAL hits this node admitted from grants and
// has not reported yet to their owners, so that none is lost when it
// stops. It is a step of shutdown, after Run has returned.
func (s *Service) FlushGlobal(ctx context.Context) { s.global.Flush(ctx) }

// Lease answers a lessee's call (RateLimiter/Lease): see package lease.
func (s *Service) Lease(ctx context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	return s.leases.Lease(ctx, req)
}
