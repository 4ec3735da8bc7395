// Package global runs the GLOBAL behaviour: checks answered at once from
// local state, never more than the limit in total.
//
// The key's owner holds the counter and lends each other node a grant,
// hits the node may admit on its own, reserved against the counter: the
// owner admits, and lends, only what is not lent out. Every sync interval
// (Run) each node reports the running total it admitted; the owner
// charges it, lends the remaining hits out again (at most
// remaining/members a node) and broadcasts grants and state. The key's
// heir keeps the broadcast grants (heir.go), so a crashed owner loses
// little more than a counter does. The owner lends to lessees too
// (lessees.go), lends escrow in strict mode (escrow.go) and keeps the
// parents of checks with a ceiling (parent.go). State is sharded by key.
// See docs/global.md and docs/design-global.md.
package global

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// DefaultInterval is the default time between sync rounds (--global-sync).
const DefaultInterval = 100 * time.Millisecond

// Store is what GLOBAL needs of the counter store: *limiter.Store.
type Store interface {
	Decide(r *limiter.Request) algorithms.Decision
	Check(r *limiter.Request) algorithms.Decision
	// Charge counts hits another node already admitted, as many as the
	// counter has left.
	Charge(r *limiter.Request) algorithms.Decision
}

// Membership is what GLOBAL needs of the cluster.
type Membership interface {
	Ring() *ring.Ring
	LocalMember() ring.Member
}

// Peers sends GLOBAL traffic to other nodes: package peer's Pool.
type Peers interface {
	AddGlobalHits(ctx context.Context, addr, from string, reports []*peerpb.GlobalReport) error
	UpdateGlobals(ctx context.Context, addr, from string, states []*peerpb.GlobalState) error
}

// Config configures a Node. Store and Cluster are required; Peers is
// needed once the cluster has other members.
type Config struct {
	Store   Store
	Cluster Membership
	Peers   Peers
	// Interval is the time between sync rounds; zero means DefaultInterval.
	Interval time.Duration
	// MaxClockSkew bounds how far past this node's clock an owner's state
	// may put a counter's reset time, beyond its refill time, and how far
	// from it a reported check's created_at_ms may lie (checks.Request);
	// zero means none.
	MaxClockSkew time.Duration
	// Now is the clock counters are evaluated at; nil means time.Now.
	Now func() time.Time
	// Inherit, if not nil, is called before this node charges reports to
	// counters it owns (Receive, and its own reports once it owns a key),
	// so that the replicas of keys it has just inherited are its counters
	// first: charged into an empty counter, hits would be lost when the
	// replica is merged in (merging keeps the more charged state, it does
	// not add). Service promotes replicas in it (replica.Node.Promote).
	Inherit func()
	// Logger receives warnings of failed sends; nil discards them.
	Logger *slog.Logger
	// Registerer receives the GLOBAL metrics; nil registers none.
	Registerer prometheus.Registerer
	// Leases bounds the accounts of lessees (see Lend); its zero fields
	// mean their defaults.
	Leases LeaseConfig
	// Escrow is strict mode's rules (escrow.go); the zero value is none.
	Escrow EscrowConfig
}

// Node is one node's side of the GLOBAL protocol: the grants it holds for
// counters others own, and the leases it lends for counters it owns. It is
// safe for concurrent use; Run drives its sync rounds.
type Node struct {
	store    Store
	cluster  Membership
	peers    Peers
	inherit  func()
	interval time.Duration
	skew     time.Duration
	now      func() time.Time
	log      *slog.Logger
	metrics  metrics
	sampled  sampled    // the rejected items' log lines
	members  members    // who was in the ring lately, for reports
	tenure   tenure     // the rings seen lately, for new shares (tenure.go)
	heirs    ring.Heirs // whose keys this node would inherit, for broadcasts
	leases   LeaseConfig
	book     book // the lessee accounts, counted for the bounds of leases
	escrow   EscrowConfig

	shards    [numShards]shard
	lastEpoch atomic.Int64 // the newest entry's first epoch
}

// numShards is how many locks GLOBAL state is split over: enough that
// concurrent checks on a few cores rarely meet.
const numShards = 64

// shard is one lock's worth of GLOBAL state.
type shard struct {
	mu      sync.Mutex
	entries map[key]*entry     // counters others own
	leases  map[key]*lease     // counters this node owns
	heirs   map[key]*heirLease // grants of counters this node would inherit (heir.go)
	dirty   map[key]struct{}
	book    *book    // the Node's
	_       [64]byte // keeps neighbouring shards' locks off one cache line
}

// key identifies a counter without building a string.
type key struct{ name, key string }

// New returns a Node. It starts nothing: Run drives the sync rounds.
func New(conf Config) *Node {
	n := &Node{store: conf.Store, cluster: conf.Cluster, peers: conf.Peers, inherit: conf.Inherit,
		interval: conf.Interval, skew: conf.MaxClockSkew, now: conf.Now, log: conf.Logger, leases: conf.Leases.withDefaults(), escrow: conf.Escrow}
	n.book = book{conf: n.leases, keys: map[Lessee]int{}}
	n.metrics = newMetrics(conf.Registerer, &n.book)
	if n.interval <= 0 {
		n.interval = DefaultInterval
	}
	if n.now == nil {
		n.now = time.Now
	}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	for i := range n.shards {
		n.shards[i] = shard{entries: map[key]*entry{}, leases: map[key]*lease{}, heirs: map[key]*heirLease{}, dirty: map[key]struct{}{}, book: &n.book}
	}
	return n
}

func (n *Node) shard(k key) *shard { return &n.shards[xxhash.Sum64String(k.key)%numShards] }

// Decide decides a GLOBAL check whose key owner owns. When this node is
// the owner it decides at once, from what is not lent out; otherwise it
// answers from this node's grant, or returns forward when the owner must
// decide: this node has no grant yet, its grant is spent while the owner
// has hits left to lend, or the check resets the counter.
func (n *Node) Decide(r *limiter.Request, owner string) (d algorithms.Decision, forward bool) {
	if owner == n.cluster.LocalMember().Name {
		return n.decideOwned(r), false
	}
	return n.decideFromGrant(r, owner, false)
}

// Run syncs every interval until ctx ends. Flush sends the last reports.
func (n *Node) Run(ctx context.Context) error {
	t := time.NewTicker(n.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			start := time.Now()
			n.Sync(ctx)
			n.metrics.syncSeconds.Observe(time.Since(start).Seconds())
		}
	}
}

// Sync runs one round: this node's reports to owners (Report), then its
// broadcast of the counters it owns (Broadcast). Tests of several nodes
// call the halves themselves, every node's Report before any Broadcast,
// to make a round deterministic.
func (n *Node) Sync(ctx context.Context) {
	n.Report(ctx)
	n.Broadcast(ctx)
}

// Flush reports the hits this node admitted from grants and has not
// reported yet, so that none is lost when the node stops. It is a step of
// shutdown, after Run has ended.
func (n *Node) Flush(ctx context.Context) { n.Report(ctx) }

type metrics struct {
	syncSeconds  prometheus.Histogram
	sendErrors   prometheus.Counter
	rejected     *prometheus.CounterVec
	excessHits   prometheus.Counter
	leaseRefused *prometheus.CounterVec
	leaseExpired prometheus.Counter
	leaseExcess  prometheus.Counter
}

// newMetrics returns the GLOBAL metrics, with the lessees' gauges read
// from b, registered on reg if it is not nil.
func newMetrics(reg prometheus.Registerer, b *book) metrics {
	m := metrics{
		syncSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ringlimit_global_sync_seconds",
			Help:    "Time one GLOBAL sync round took: hits sent to owners and owners' state broadcast.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
		sendErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_global_send_errors_total",
			Help: "GLOBAL reports or broadcasts that failed; reports are kept and sent again at the next sync.",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_peer_rejected_total",
			Help: "Items of peer RPCs rejected and not merged, by kind (global_report, global_state) and reason (invalid; not_owner; over_grant: a report charged only in part).",
		}, []string{"kind", "reason"}),
		excessHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_global_excess_hits_total",
			Help: "Hits that GLOBAL reports claimed beyond what the reporting node could have admitted (its grant, or one share for a new account), and that were not charged.",
		}),
		leaseRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_lease_refused_total",
			Help: "Lessees' reports refused because a new account would pass a bound, by reason: lessees (--max-lessees), per_key (--max-leases-per-key), per_lessee (--max-keys-per-lessee), total (200,000 accounts a node).",
		}, []string{"reason"}),
		leaseExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_lease_expired_total",
			Help: "Lessees' accounts freed because no report renewed them within --lease-ttl.",
		}),
		leaseExcess: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_lease_excess_hits_total",
			Help: "Hits lessees reported beyond their grants, and that were not charged.",
		}),
	}
	for _, reason := range []string{"lessees", "per_key", "per_lessee", "total"} {
		m.leaseRefused.WithLabelValues(reason) // exported at 0, so that alerts see the series
	}
	if reg != nil {
		reg.MustRegister(m.syncSeconds, m.sendErrors, m.rejected, m.excessHits, m.leaseRefused, m.leaseExpired, m.leaseExcess,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "ringlimit_lessees",
				Help: "Lessees holding accounts on this node, as the owner of their keys.",
			}, func() float64 { lessees, _ := b.counts(); return float64(lessees) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "ringlimit_lease_accounts",
				Help: "Lessees' accounts of keys this node owns.",
			}, func() float64 { _, accounts := b.counts(); return float64(accounts) }))
	}
	return m
}
