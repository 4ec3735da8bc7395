// Package replica keeps a copy of every counter on the node that would
// own it if its owner were gone (its heir), so that a crashed node's
// counters survive it.
//
// Each owner sends, every Config.Interval (Run), the counters that changed
// since its last round (limiter.Store.Changed) to their heirs, whole, as
// hand-off's record; the heir merges them into a store of replicas kept
// apart under the sender's name, from which no check is decided. When the
// ring changes a node promotes the replicas of the keys it now owns
// (Promote) before it decides any check on the new ring, and owners send
// again the counters whose heir changed. Only the key's owner's replica is
// ever promoted: one whose sender owned the key and left the ring, or, on
// failover, the unreachable owner's. A member that comes back gets its
// replicas back (Return). What a crash loses is one interval of hits and
// a round's trip. See docs/design-cluster.md, "Replicas".
package replica

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/handoff"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// DefaultInterval is how often, by default, an owner sends its changed
// counters to their heirs: the hits of one interval are what a crash loses.
const DefaultInterval = 100 * time.Millisecond

// Membership is what replication needs of the cluster: the ring this node
// routes by and which member it is.
type Membership interface {
	Ring() *ring.Ring
	LocalMember() ring.Member
}

// Peers sends replicas to a key's heir: package peer's Pool. It returns
// the heir's refusals, by index into counters.
type Peers interface {
	Replicate(ctx context.Context, addr, from string, counters []*peerpb.CounterState) ([]*peerpb.Refusal, error)
}

// Config configures a Node. Store, Replicas and Cluster are required;
// Peers is needed once the cluster has other members.
type Config struct {
	// Store is this node's counters, which it replicates and into which it
	// promotes replicas.
	Store *limiter.Store
	// Replicas holds the replicas this node keeps for other owners, apart
	// from Store, bounded as any store is (its MaxKeys, least recently
	// used first, and idle ones dropped).
	Replicas *limiter.Store
	Cluster  Membership
	Peers    Peers
	// Interval is how often changed counters go to their heirs; zero
	// means this node sends none. It still keeps and promotes the replicas
	// that others send.
	Interval time.Duration
	// Intake validates received replicas, as hand-off validates counters.
	Intake checks.Intake
	// Now is the clock received replicas are validated against, and the
	// replication lag is measured by; nil means time.Now.
	Now func() time.Time
	// Logger receives a line per promotion and per failed batch; nil
	// discards them.
	Logger *slog.Logger
	// Registerer receives the replication metrics; nil registers none.
	Registerer prometheus.Registerer
	// Heirs, if not nil, builds the ring without this node, shared with
	// whoever else builds it for the same ring (see handoff.Config.Heirs).
	Heirs *ring.Heirs
}

// Node is one node's side of replication: sending its changed counters to
// their heirs (Run), keeping the replicas others send (Receive) and
// promoting them when their owner leaves the ring (Promote). It is safe
// for concurrent use, but for Replicate, which only Run calls.
type Node struct {
	store    *limiter.Store
	replicas *limiter.Store
	cluster  Membership
	peers    Peers
	interval time.Duration
	intake   checks.Intake
	now      func() time.Time
	log      *slog.Logger
	metrics  metrics

	changed chan struct{} // cap 1: coalesces bursts of ring changes

	promoted  atomic.Pointer[rings] // the ring whose replicas were promoted last, and the one before
	promoteMu sync.Mutex            // one promotion at a time

	heirs heirs // of the ring of the last round; used by Replicate only
	// ringCache builds heirs' rings (Config.Heirs).
	ringCache *ring.Heirs
	synced    atomic.Int64 // Unix ns at which the last round that delivered every batch began
}

// rings are the ring of the last promotion and the ring before it, whose
// owners sent the replicas that promotion took.
type rings struct {
	now, before *ring.Ring
}

// heirs is the ring without this node, by which its keys' heirs are found,
// for the ring it was built from. The zero value is of no ring, with no
// heirs.
type heirs struct {
	of, without *ring.Ring
}

// New returns a Node. It starts nothing.
func New(conf Config) *Node {
	n := &Node{store: conf.Store, replicas: conf.Replicas, cluster: conf.Cluster, peers: conf.Peers,
		interval: conf.Interval, intake: conf.Intake, now: conf.Now, log: conf.Logger, changed: make(chan struct{}, 1),
		ringCache: conf.Heirs}
	if n.ringCache == nil {
		n.ringCache = &ring.Heirs{}
	}
	if n.now == nil {
		n.now = time.Now
	}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	n.synced.Store(n.now().UnixNano())
	n.metrics = newMetrics(conf.Registerer, n)
	// The ring at start is the one before the first change: its owners
	// are those whose replicas the first change may promote.
	n.promoted.Store(&rings{now: n.cluster.Ring()})
	return n
}

// RingChanged tells the node that the ring changed, so that Run promotes
// the replicas of keys this node now owns (if no check did first). (The
// next round finds the ring changed, and sends again the counters whose
// heir changed.) It never blocks.
func (n *Node) RingChanged() {
	select {
	case n.changed <- struct{}{}:
	default:
	}
}

// Run sends changed counters to their heirs every Config.Interval, and
// reacts to ring changes, until ctx ends. With a zero Interval it only
// promotes on ring changes.
func (n *Node) Run(ctx context.Context) error {
	var tick <-chan time.Time
	if n.interval > 0 {
		t := time.NewTicker(n.interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.changed:
			n.Promote(n.cluster.Ring())
		case <-tick:
			n.Replicate(ctx)
		}
	}
}

// Replicate is one round: it sends every counter of this node's own keys
// that changed since the last round, or whose heir changed with the ring
// (see follow), to the key's heir, in batches of at most
// peerpb.MaxHandOffCounters counters and MaxHandOffBytes, and returns how
// many the heirs took. Counters whose batch could not be delivered are
// marked changed again (limiter.Store.Remark), so that the next round
// sends them; those of an heir that failed are not sent to it again this
// round. Counters this node holds for keys it does not own are hand-off's,
// not replicated. Run calls it every interval; a test may call it instead
// of Run, never while Run runs.
func (n *Node) Replicate(ctx context.Context) int {
	start := n.now()
	r := n.cluster.Ring()
	self := n.cluster.LocalMember().Name
	n.follow(r, self)
	batches := map[string]*handoff.Batch{}
	failed := map[string]bool{}
	var retry []limiter.Counter
	sent := 0
	for c := range n.store.Changed() {
		if owner, ok := r.Owner(c.Key); !ok || owner.Name != self {
			continue
		}
		heir, ok := n.heirs.without.Owner(c.Key)
		if !ok {
			continue // alone in the cluster: no one to inherit
		}
		record, err := c.AppendBinary(nil)
		if err != nil {
			continue // the store's counters were made by valid checks, so they encode
		}
		b := batches[heir.Name]
		if b != nil && !b.Fits(len(record)) {
			delete(batches, heir.Name)
			sent += n.send(ctx, b, failed)
			b = nil
		}
		if failed[heir.Name] {
			retry = append(retry, c)
			continue
		}
		if b == nil {
			b = &handoff.Batch{To: heir}
			batches[heir.Name] = b
		}
		b.Add(c, record)
	}
	for _, b := range batches {
		sent += n.send(ctx, b, failed)
	}
	if len(retry) > 0 {
		n.store.Remark(retry)
	}
	if len(failed) == 0 {
		n.synced.Store(start.UnixNano())
	}
	return sent
}

// follow makes r the ring whose heirs Replicate sends to, if it is not
// already, and marks changed every counter whose key's heir differs from
// its heir under the ring before, so that this round sends it to its new
// heir. (Counters that come to this node with the keys it gains are
// marked already: hand-off and promotion merge them.) It costs a ring
// build per ring change.
func (n *Node) follow(r *ring.Ring, self string) {
	if n.heirs.of == r {
		return
	}
	old := n.heirs
	n.heirs = heirs{of: r, without: n.ringCache.Without(r, self)}
	moved := make([]bool, ring.PartitionCount)
	for p := range moved {
		was, _ := old.without.PartitionOwner(p)
		now, _ := n.heirs.without.PartitionOwner(p)
		moved[p] = was != now // another member, or its process started again (Member.Boot): its replicas are gone
	}
	n.store.MarkChanged(func(key string) bool { return moved[ring.Partition(key)] })
}

// send sends b to its heir and returns how many counters it took. A batch
// that fails is given back to the store, marked changed, and its heir is
// noted in failed.
func (n *Node) send(ctx context.Context, b *handoff.Batch, failed map[string]bool) int {
	refused, err := n.peers.Replicate(ctx, b.To.PeerAddr, n.cluster.LocalMember().Name, b.Records)
	if err != nil {
		n.metrics.batches.WithLabelValues("failed").Inc()
		n.log.Debug("replication to an heir failed; sending again next round", "heir", b.To.Name, "counters", len(b.Counters), "err", err)
		n.store.Remark(b.Counters)
		failed[b.To.Name] = true
		return 0
	}
	n.metrics.batches.WithLabelValues("sent").Inc()
	n.metrics.bytes.Add(float64(b.Bytes))
	if len(refused) > 0 {
		// Counters the heir found invalid would be refused again: they are
		// not sent again until they change. (The heir logs and counts why.)
		n.log.Warn("replication: the heir refused counters", "heir", b.To.Name, "refused", len(refused), "of", len(b.Counters),
			"first", refused[0].GetDetail())
	}
	taken := len(b.Counters) - len(refused)
	n.metrics.counters.WithLabelValues("sent").Add(float64(taken))
	return taken
}

// Receive keeps copies of counters that node from owns, merging each into
// the replicas, under from's name, after validating it as hand-off does
// (checks.Intake), and returns a Refusal for each it did not keep.
// Replicas are never used to decide a check until Promote or PromoteKey
// makes them this node's counters, and only those from the key's owner
// ever are. from must be a peer's name, as the peer server checks it (no
// NUL: see heldKey).
func (n *Node) Receive(from string, counters []*peerpb.CounterState) []*peerpb.Refusal {
	refused := n.intake.Merge(sentBy{n.replicas, from}, counters, n.now())
	for _, r := range refused {
		n.metrics.refused.WithLabelValues(checks.ReasonLabel(r.GetReason())).Inc()
	}
	if len(refused) > 0 {
		n.log.Warn("replication: counters refused", "from", from, "refused", len(refused), "of", len(counters),
			"first", refused[0].GetDetail())
	}
	n.metrics.counters.WithLabelValues("received").Add(float64(len(counters) - len(refused)))
	return refused
}

// sentBy merges counters into replicas under the key heldKey gives them,
// which records who sent each, after validating each under its own key.
type sentBy struct {
	replicas *limiter.Store
	from     string
}

func (s sentBy) Merge(c limiter.Counter, now time.Time, skew time.Duration) error {
	return s.replicas.MergeUnder(c, heldKey(s.from, c.Key), now, skew)
}

// heldKey is the key a replica of key sent by member from is kept under:
// from, a NUL and key. Replicas of one key from two members stay apart,
// and each says who sent it. Member names hold no NUL (the peer server
// refuses one that does), so the first NUL ends the sender's name; the
// key may hold any byte. A held key may be longer than limiter.MaxKeyLen:
// the store bounds keys only in MergeUnder, which sees the real one.
func heldKey(from, key string) string { return from + "\x00" + key }

// splitHeld returns the sender and the key of a held key (see heldKey).
func splitHeld(held string) (from, key string) {
	from, key, _ = strings.Cut(held, "\x00")
	return from, key
}

// Promote makes this node's own counters, merging each into the store,
// the replicas of the keys that r gives this node whose sender owned the
// key in the ring of the last promotion and is not in r: the key's owner
// left the ring or failed, and this node inherits its key. It does so
// once per ring: a call with the ring of the last promotion costs an
// atomic load. Call it with the ring a check is routed by before deciding
// it, so that no check for a key inherited from a crashed owner is
// decided while its replica waits here. A ring other than the cluster's
// current one (a check routed just before a change) promotes nothing:
// under it, this node owned its keys already. Replicas of other senders
// stay where they are, never decided from: a member that sends replicas
// of keys it does not own changes no counter by it.
func (n *Node) Promote(r *ring.Ring) {
	if n.promoted.Load().now == r {
		return
	}
	n.promoteMu.Lock()
	defer n.promoteMu.Unlock()
	last := n.promoted.Load()
	if last.now == r || r != n.cluster.Ring() {
		return
	}
	self := n.cluster.LocalMember().Name
	var moved []limiter.Counter
	for c := range n.replicas.Extract(func(held string) bool {
		from, key := splitHeld(held)
		owner, ok := r.Owner(key)
		if !ok || owner.Name != self || r.Has(from) {
			return false
		}
		was, ok := last.now.Owner(key)
		return ok && was.Name == from
	}) {
		_, c.Key = splitHeld(c.Key)
		moved = append(moved, c)
	}
	if len(moved) > 0 {
		// Replicas were validated when they arrived: Promote merges them
		// as the store's own, and marks them changed, so that they go to
		// their new heir next round.
		n.store.Promote(moved)
		n.metrics.promoted.Add(float64(len(moved)))
		n.log.Info("promoted replicas of keys this node now owns", "counters", len(moved))
	}
	n.promoted.Store(&rings{now: r, before: last.now})
}

// Return gives back to each member of r that is new since prev, or a new
// process under its name (ring.Member.Boot), the replicas it sent this
// node of the keys it owns in r: they become counters of this node's
// store (merged as Promote merges them), which its next round of hand-off
// sends to their owner, so that a member that crashed and came back
// without its counters (or with an older snapshot of them) gets them
// back, merged with what it holds. Call it before that round. It returns
// how many it gave back.
func (n *Node) Return(prev, r *ring.Ring) int {
	self := n.cluster.LocalMember().Name
	back := map[string]bool{}
	for _, m := range r.Members() {
		if was, ok := prev.Member(m.Name); m.Name != self && (!ok || was.Boot != m.Boot) {
			back[m.Name] = true
		}
	}
	if len(back) == 0 {
		return 0
	}
	var moved []limiter.Counter
	for c := range n.replicas.Extract(func(held string) bool {
		from, key := splitHeld(held)
		owner, ok := r.Owner(key)
		return back[from] && ok && owner.Name == from
	}) {
		_, c.Key = splitHeld(c.Key)
		moved = append(moved, c)
	}
	if len(moved) > 0 {
		n.store.Promote(moved) // validated when they arrived, as in Promote
		n.metrics.returned.Add(float64(len(moved)))
		n.log.Info("gave replicas back to members that came back", "counters", len(moved), "members", len(back))
	}
	return len(moved)
}

// PromoteKey makes the replicas of r's counters (its own, and the spacing
// of a request with a MinInterval) that the key's owner sent, if this
// node holds them, its own counters, before it decides r as the key's
// heir for an owner that cannot be reached (see service's failover), or
// as its new owner when the one before cannot be reached. The owner is
// the key's in the ring of the last promotion, or, if that is this node,
// in the ring before it. It reports whether there was one.
func (n *Node) PromoteKey(r *limiter.Request) bool {
	last := n.promoted.Load()
	self := n.cluster.LocalMember().Name
	owner, ok := last.now.Owner(r.Key)
	if ok && owner.Name == self && last.before != nil {
		owner, ok = last.before.Owner(r.Key)
	}
	if !ok || owner.Name == self {
		return false
	}
	held := *r
	held.Key = heldKey(owner.Name, r.Key)
	cs := n.replicas.TakeOut(&held)
	if len(cs) == 0 {
		return false
	}
	for i := range cs {
		cs[i].Key = r.Key
	}
	n.store.Promote(cs) // validated when they arrived, as in Promote
	n.metrics.promoted.Add(float64(len(cs)))
	return true
}

// Lag is how long ago the last round that delivered every batch began:
// no change older than that is unsent.
func (n *Node) Lag() time.Duration {
	if n.interval <= 0 {
		return 0
	}
	return n.now().Sub(time.Unix(0, n.synced.Load()))
}

type metrics struct {
	counters *prometheus.CounterVec
	refused  *prometheus.CounterVec
	batches  *prometheus.CounterVec
	bytes    prometheus.Counter
	promoted prometheus.Counter
	returned prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, n *Node) metrics {
	m := metrics{
		counters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_replication_counters_total",
			Help: "Counters sent to their heir and kept there (direction=sent), or kept here as replicas for another owner (direction=received).",
		}, []string{"direction"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_replication_refused_total",
			Help: "Replicated counters this node refused to keep, by reason (unknown_version, invalid, unavailable).",
		}, []string{"reason"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_replication_batches_total",
			Help: "Batches of changed counters sent to an heir, by outcome: sent, or failed (sent again next round).",
		}, []string{"outcome"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_replication_sent_bytes_total",
			Help: "Bytes of counter records in the replication batches heirs took.",
		}),
		promoted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_replicas_promoted_total",
			Help: "Replicas made this node's own counters because the ring gave it their keys, as when their owner crashed.",
		}),
		returned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_replicas_returned_total",
			Help: "Replicas handed back to their owner because it came back to the ring, or as a new process under its name (after a crash).",
		}),
	}
	for _, d := range []string{"sent", "received"} {
		m.counters.WithLabelValues(d)
	}
	for _, o := range []string{"sent", "failed"} {
		m.batches.WithLabelValues(o)
	}
	for _, r := range []peerpb.Refusal_Reason{peerpb.Refusal_UNKNOWN_VERSION, peerpb.Refusal_INVALID, peerpb.Refusal_UNAVAILABLE} {
		m.refused.WithLabelValues(checks.ReasonLabel(r))
	}
	if reg != nil {
		reg.MustRegister(m.counters, m.refused, m.batches, m.bytes, m.promoted, m.returned,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "ringlimit_replicas",
				Help: "Replicas this node keeps of other owners' counters, to take over should their owner crash.",
			}, func() float64 { return float64(n.replicas.Len()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "ringlimit_replication_lag_seconds",
				Help: "Age of the oldest change that may not have reached its heir: since the start of the last replication round that delivered every batch. 0 with --replicate-interval=0.",
			}, func() float64 { return n.Lag().Seconds() }))
	}
	return m
}
