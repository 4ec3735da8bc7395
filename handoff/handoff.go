// Package handoff moves counters to their new owner when the ring
// changes, so that scaling out, a rolling restart or a node's shutdown
// does not reset limits.
//
// Each node sends the counters it holds for keys it no longer owns to
// their owner, which merges them (the more charged state wins; merging
// never refills). A counter travels as limiter.Counter's versioned record.
// The receiver validates every record as strictly as the public API
// validates a check, and answers per counter which it refused and why; the
// sender keeps those, logs and counts them, and offers them again at the
// next ring change. Nothing is dropped silently.
package handoff

import (
	"context"
	"iter"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/mux"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// A HandOff RPC carries at most peerpb.MaxHandOffCounters counters and
// peerpb.MaxHandOffBytes of encoded records, the bounds the peer server
// takes, so that it always fits the server's receive limit: 1 MiB holds
// six full sliding logs (~160 KB each) or a thousand small counters. A
// batch that a node refuses for its size all the same (an older node
// with a smaller limit) is split in half and sent again.

// Store is what hand-off needs of the counter store: *limiter.Store.
type Store interface {
	// Extract removes and yields the counters whose key move accepts.
	Extract(move func(key string) bool) iter.Seq[limiter.Counter]
	// Restore puts counters back that could not be handed off.
	Restore(cs []limiter.Counter)
	// Len returns how many counters the store holds.
	Len() int
	// Merge validates c and folds it into the store.
	Merge(c limiter.Counter, now time.Time, skew time.Duration) error
}

// Membership is what hand-off needs of the cluster.
type Membership interface {
	Ring() *ring.Ring
	LocalMember() ring.Member
	// Ready reports whether this node has joined the cluster: before, a
	// ring that holds only itself is no sign that it owns every key (see
	// Node.Await).
	Ready() bool
	// Returning reports, for a process that took over a name the cluster
	// knew from an earlier process, the members its join found alive, nil
	// otherwise (see cluster.Cluster.Returning): until its ring has them
	// all, it waits for each key's heir (see newWaits).
	Returning() []string
}

// Peers sends counters to their new owner: package peer's Pool. It returns
// the owner's refusals, by index into counters. An error with gRPC's code
// RESOURCE_EXHAUSTED says the batch was too large to send or receive.
type Peers interface {
	HandOff(ctx context.Context, addr, from string, counters []*peerpb.CounterState) ([]*peerpb.Refusal, error)
	// HandOffDone tells the node at addr that node from has handed it
	// every counter it held for keys the node owns in the ring whose ID is
	// ring.
	HandOffDone(ctx context.Context, addr, from string, ring uint64) error
}

// Config configures a Node. Store, Cluster and MaxClockSkew are required;
// Peers is needed once the cluster has other members.
type Config struct {
	Store   Store
	Cluster Membership
	Peers   Peers
	// MaxClockSkew bounds how far past this node's clock a received
	// counter's times may lie. A received counter is taken in as
	// checks.Intake takes it: only one a check could have made.
	MaxClockSkew time.Duration
	// Wait is how long, at most, a check for a key this node has just come
	// to own waits for the member that held its counter to hand it over
	// (see Await). Zero means checks never wait.
	Wait time.Duration
	// Now is the clock received counters are validated against; nil means
	// time.Now.
	Now func() time.Time
	// HandedOff, if not nil, is given the records of the counters an owner
	// took, a batch at a time, on the goroutine handing them off: a node
	// shutting down keeps them in its final snapshot (package snapshot),
	// whatever becomes of them at an owner that is stopping too.
	HandedOff func(records [][]byte)
	// Logger receives a line per hand-off and per refused batch; nil
	// discards them.
	Logger *slog.Logger
	// Registerer receives the hand-off metrics; nil registers none.
	Registerer prometheus.Registerer
	// Heirs, if not nil, builds the rings without one member that the node
	// needs (a node that has just joined finds who held its keys in the
	// ring without itself), shared with whoever else builds them for the
	// same ring: a ring build costs ~10ms of CPU at 33 members, spent by
	// a joining node while checks wait on it.
	Heirs *ring.Heirs
}

// Node is one node's side of hand-off: sending counters it no longer owns,
// receiving those it now owns. It is safe for concurrent use; Run hands
// off after every ring change.
type Node struct {
	store     Store
	cluster   Membership
	peers     Peers
	heirs     *ring.Heirs
	intake    checks.Intake
	now       func() time.Time
	handedOff func(records [][]byte)
	log       *slog.Logger
	metrics   metrics

	changed chan struct{} // cap 1: coalesces bursts of changes
	// strayed is set while a round is due for counters received for keys
	// this node does not own (see Receive).
	strayed atomic.Bool
	mu      sync.Mutex // one hand-off at a time
	// moving is held by a round from the moment it takes counters out of
	// the store until each is with its owner or back in the store (see
	// Hold).
	moving sync.RWMutex

	wait   time.Duration
	waits  atomic.Pointer[waits] // of the newest ring seen
	waitMu sync.Mutex            // guards the making of waits, and done
	done   map[string]uint64     // member -> ID of the ring it last said it is done under
	// back says a returning process (Membership.Returning) has had a ring
	// with every member its join found: its heirs are no longer waited
	// for as such (see newWaits). Guarded by waitMu.
	back bool
	had  hadRings // the rings this node has left, guarded by waitMu

	giftMu sync.Mutex
	gifts  map[int]gift // by partition: what members gave away that this node's ring gives them (see Receive)
}

// gift is the counters of a partition that by, its owner in the ring
// whose ID is ring, handed this node: by's own ring gives the partition to
// another node, this node's lags or by is leaving.
type gift struct {
	by   ring.Member
	ring uint64
}

// New returns a Node. It starts nothing.
func New(conf Config) *Node {
	n := &Node{store: conf.Store, cluster: conf.Cluster, peers: conf.Peers, heirs: conf.Heirs,
		intake: checks.Intake{MaxClockSkew: conf.MaxClockSkew}, now: conf.Now, handedOff: conf.HandedOff, log: conf.Logger,
		metrics: newMetrics(conf.Registerer), changed: make(chan struct{}, 1), wait: conf.Wait, done: map[string]uint64{},
		gifts: map[int]gift{}}
	if n.heirs == nil {
		n.heirs = &ring.Heirs{}
	}
	if n.now == nil {
		n.now = time.Now
	}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	// The ring at the start, to compare the first change with: a node that
	// has seen only itself so far waits for every key it gains.
	r := conf.Cluster.Ring()
	n.waits.Store(&waits{ring: r, id: r.ID(), joined: conf.Cluster.Ready()})
	return n
}

// RingChanged tells the node that the ring changed, so that Run hands off
// the counters it no longer owns, and works out which keys gained in the
// change wait for their counter (see Await): every change is compared
// with the one before, even if no check came in between. It does not wait
// for the network.
func (n *Node) RingChanged() {
	if n.wait > 0 {
		n.waitsFor(n.cluster.Ring())
	}
	select {
	case n.changed <- struct{}{}:
	default:
	}
}

// Retry bounds the wait between rounds of Run while counters are left
// that an owner did not take.
const (
	retryMin = 50 * time.Millisecond
	retryMax = time.Second
)

// Run hands off after every ring change until ctx ends. While a round
// leaves counters here that their owner did not take (it could not be
// reached, or refused them for now: a node that has just joined refuses
// members its gossip has not told it of yet), or could not tell a member
// it is done (refused so too), it tries again, waiting a little longer
// each time (retryMin doubling to retryMax), rather than until the next
// ring change: the owner, which waits for the counters only
// --handoff-wait, would decide their keys on empty counters meanwhile,
// and a member not told holds the keys it gained from this node late
// after its wait (see Await), each key's first check waiting
// --handoff-wait again.
func (n *Node) Run(ctx context.Context) error {
	retry := time.NewTimer(retryMax)
	retry.Stop()
	defer retry.Stop()
	wait := retryMin
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.changed:
			wait = retryMin
		case <-retry.C:
		}
		if t := n.handOff(ctx); t.kept > 0 || t.unavailable > 0 || t.untold > 0 {
			retry.Reset(wait)
			wait = min(2*wait, retryMax)
		}
	}
}

// tally is what one round of hand-off did, for its log line.
type tally struct {
	sent, refused, kept int
	unavailable         int // of refused: the owner could not take them now
	untold              int // members the round could not tell it is done
}

// round is one round of hand-off in progress.
type round struct {
	tally
	incomplete map[string]bool // owners that did not get every counter of theirs: not told the round is done
}

// keep notes that counters of owner stay here for now.
func (rd *round) keep(owner string, counters int) {
	rd.kept += counters
	rd.incomplete[owner] = true
}

// Batch is counters bound for one member, with their records: one RPC's
// worth, within peerpb.MaxHandOffCounters and MaxHandOffBytes. Hand-off and replication
// (package replica) batch alike.
type Batch struct {
	To       ring.Member
	Counters []limiter.Counter
	Records  []*peerpb.CounterState
	Bytes    int // of Records
}

// Add adds c, whose record is record.
func (b *Batch) Add(c limiter.Counter, record []byte) {
	b.Counters = append(b.Counters, c)
	b.Records = append(b.Records, &peerpb.CounterState{Counter: record})
	b.Bytes += len(record)
}

// Fits reports whether b can take a record of n more bytes.
func (b *Batch) Fits(n int) bool {
	return len(b.Counters) < peerpb.MaxHandOffCounters && b.Bytes+n <= peerpb.MaxHandOffBytes
}

// HandOff sends every counter this node holds but does not own under the
// current ring to its owner, and returns how many the owners took.
// Counters an owner refused, and those whose owner cannot be reached, stay
// here, and are offered again at the next ring change.
func (n *Node) HandOff(ctx context.Context) int { return n.handOff(ctx).sent }

// Hold keeps hand-off rounds from taking counters out of the store until
// release is called, once the round in flight, if any, has put each of its
// counters with its owner or back in the store. Meanwhile a counter is
// either here (Store.Holds) or with its owner, never on its way: a leaving
// node holds it while it decides where a check goes (see
// service.Service.Leave). Many may hold it at once. A round in flight
// waits on owners, and so does a Hold meanwhile: a stream's request that
// waits for it first lets the stream's next requests through
// (mux.Detach), as a wait on ctx would.
func (n *Node) Hold(ctx context.Context) (release func()) {
	if !n.moving.TryRLock() {
		mux.Detach(ctx)
		n.moving.RLock()
	}
	return n.moving.RUnlock
}

// HandOffAll is a step of shutdown, once this node routes by the ring
// without itself (service.Service.Leave), so that every counter it holds
// belongs to another node: it hands off until
// every counter is taken, or none is left that trying again could
// deliver (owners refused them as invalid), or ctx ends, waiting a little
// longer between rounds. It returns how many counters the owners took and
// how many this node still holds, which it exports as
// ringlimit_handoff_pending_counters: after the last hand-off of shutdown,
// those are lost when it exits. The last node of a cluster (an empty
// ring) has no one to hand off to, and reports none left.
func (n *Node) HandOffAll(ctx context.Context) (sent, left int) {
	wait := 50 * time.Millisecond
	rounds := 0
	for {
		t := n.handOff(ctx)
		sent += t.sent
		rounds++
		if t.kept == 0 && t.unavailable == 0 {
			break
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
		}
		timer.Stop()
		if ctx.Err() != nil {
			break
		}
		wait = min(2*wait, time.Second)
	}
	if n.cluster.Ring().Len() == 0 {
		// The last node of the cluster: no one to hand counters to, and no
		// one to need them.
		n.metrics.pending.Set(0)
		return sent, 0
	}
	left = n.store.Len()
	n.metrics.pending.Set(float64(left))
	n.log.Info("hand-off rounds done", "handed_off", sent, "left", left, "rounds", rounds, "err", ctx.Err())
	return sent, left
}

// handOff is one round of HandOff. An owner that cannot be reached gets
// nothing more this round; the others still get theirs.
func (n *Node) handOff(ctx context.Context) tally {
	// One hand-off at a time: the one at shutdown must not find nothing to
	// do because the loop's is still in flight with the counters.
	n.mu.Lock()
	defer n.mu.Unlock()
	r := n.cluster.Ring()
	self := n.cluster.LocalMember().Name
	start := time.Now()
	t := round{incomplete: map[string]bool{}}
	gifts := n.giftsOf(r)
	for _, g := range gifts {
		t.incomplete[g.by.Name] = true // its keys' counters are here: it is not told this node is done
	}
	n.moving.Lock()
	batches := map[string]*Batch{}
	failed := map[string]bool{}
	var keep []limiter.Counter
	for c := range n.store.Extract(func(key string) bool {
		owner, ok := r.Owner(key)
		if !ok || owner.Name == self {
			return false
		}
		g, gave := gifts[ring.Partition(key)]
		return !gave || g.by != owner
	}) {
		owner, _ := r.Owner(c.Key)
		if ctx.Err() != nil {
			keep = append(keep, c) // what Extract has not reached stays in the store
			t.incomplete[owner.Name] = true
			break
		}
		if failed[owner.Name] {
			keep = append(keep, c)
			continue
		}
		// The store's counters were made by valid checks, so they encode;
		// an empty record would come back refused, and be kept.
		record, _ := c.AppendBinary(nil)
		b := batches[owner.Name]
		if b != nil && !b.Fits(len(record)) {
			delete(batches, owner.Name)
			if !n.send(ctx, b, &t) {
				failed[owner.Name] = true
			}
			b = nil
		}
		if failed[owner.Name] {
			keep = append(keep, c)
			continue
		}
		if b == nil {
			b = &Batch{To: owner}
			batches[owner.Name] = b
		}
		b.Add(c, record)
	}
	for _, b := range batches {
		n.send(ctx, b, &t)
	}
	if len(keep) > 0 {
		n.store.Restore(keep)
		t.kept += len(keep)
		for name := range failed {
			t.incomplete[name] = true
		}
	}
	n.moving.Unlock()
	n.metrics.pending.Set(float64(t.refused + t.kept))
	if t.tally != (tally{}) {
		n.log.Info("handed off counters", "sent", t.sent, "refused", t.refused, "kept", t.kept, "took", time.Since(start))
	}
	t.untold = n.sayDone(ctx, r, t.incomplete)
	return t.tally
}

// sayDone tells every other member of r that this node has handed it all
// it holds for it under r, but those in incomplete, concurrently, so that
// the keys they gained wait no longer than they must (see Await), and
// returns how many it could not tell. A member that does not hear it
// waits out Config.Wait.
func (n *Node) sayDone(ctx context.Context, r *ring.Ring, incomplete map[string]bool) (untold int) {
	self := n.cluster.LocalMember().Name
	id := r.ID()
	var failed atomic.Int32
	var wg sync.WaitGroup
	for _, m := range r.Members() {
		if m.Name == self || incomplete[m.Name] {
			continue
		}
		wg.Go(func() {
			if err := n.peers.HandOffDone(ctx, m.PeerAddr, self, id); err != nil {
				failed.Add(1)
				n.log.Debug("hand-off: telling a member this round is done", "member", m.Name, "err", err)
			}
		})
	}
	wg.Wait()
	return int(failed.Load())
}

// send sends b to its owner and puts back into the store whatever the
// owner did not take. A batch refused for its size is split in half, and
// each half sent on its own. It reports false if the owner could not be
// asked (and then keeps the counters it did not send).
func (n *Node) send(ctx context.Context, b *Batch, t *round) bool {
	if ctx.Err() != nil {
		n.store.Restore(b.Counters)
		t.keep(b.To.Name, len(b.Counters))
		return false
	}
	refusals, err := n.peers.HandOff(ctx, b.To.PeerAddr, n.cluster.LocalMember().Name, b.Records)
	if status.Code(err) == codes.ResourceExhausted && len(b.Counters) > 1 {
		half := len(b.Counters) / 2
		n.log.Info("hand-off batch too large for the owner; splitting it", "owner", b.To.Name,
			"counters", len(b.Counters), "bytes", b.Bytes)
		first, second := b.split(half)
		if !n.send(ctx, first, t) {
			n.store.Restore(second.Counters)
			t.keep(b.To.Name, len(second.Counters))
			return false
		}
		return n.send(ctx, second, t)
	}
	if err != nil {
		n.log.Warn("hand-off failed; keeping the counters", "owner", b.To.Name, "counters", len(b.Counters), "err", err)
		n.store.Restore(b.Counters)
		t.keep(b.To.Name, len(b.Counters))
		return false
	}
	if len(refusals) > 0 {
		kept := make([]limiter.Counter, len(refusals))
		reasons := map[string]int{}
		for i, r := range refusals {
			kept[i] = b.Counters[r.GetIndex()] // peer.Pool checked the indexes
			reason := checks.ReasonLabel(r.GetReason())
			reasons[reason]++
			if r.GetReason() == peerpb.Refusal_UNAVAILABLE {
				t.unavailable++
				t.incomplete[b.To.Name] = true
			}
			n.metrics.refused.WithLabelValues("sent", reason).Inc()
		}
		n.store.Restore(kept)
		n.log.Warn("hand-off: the new owner refused counters; keeping them", "owner", b.To.Name,
			"refused", len(refusals), "of", len(b.Counters), "reasons", reasons, "first", refusals[0].GetDetail())
		t.refused += len(refusals)
	}
	accepted := len(b.Counters) - len(refusals)
	taken := b.taken(refusals)
	if n.handedOff != nil {
		n.handedOff(taken)
	}
	t.sent += accepted
	n.metrics.counters.WithLabelValues("sent").Add(float64(accepted))
	n.metrics.bytes.WithLabelValues("sent").Add(float64(recordBytes(taken)))
	return true
}

// taken returns the records of b an owner took: all but those it
// refused.
func (b *Batch) taken(refused []*peerpb.Refusal) [][]byte {
	skip := make([]bool, len(b.Records))
	for _, r := range refused {
		skip[r.GetIndex()] = true // peer.Pool checked the indexes
	}
	out := make([][]byte, 0, len(b.Records)-len(refused))
	for i, r := range b.Records {
		if !skip[i] {
			out = append(out, r.GetCounter())
		}
	}
	return out
}

// recordBytes returns the bytes of records, as the counters' records
// count them (not the framing of the messages that carry them).
func recordBytes(records [][]byte) int {
	n := 0
	for _, r := range records {
		n += len(r)
	}
	return n
}

// split returns b's first i counters and the rest as two batches.
func (b *Batch) split(i int) (*Batch, *Batch) {
	first := &Batch{To: b.To, Counters: b.Counters[:i:i], Records: b.Records[:i:i]}
	second := &Batch{To: b.To, Counters: b.Counters[i:], Records: b.Records[i:]}
	for _, r := range first.Records {
		first.Bytes += len(r.GetCounter())
	}
	second.Bytes = b.Bytes - first.Bytes
	return first, second
}

// Receive merges counters another node no longer owns into this node's
// store through checks.Intake, which validates each as a check's and
// against this node's clock and MaxClockSkew, and returns a Refusal for
// each it did not take (an unknown version, a record that does not
// decode, a state impossible for its limit), logged once a call and
// counted. A counter for a key this node does not own goes on to its
// owner soon after (see Strays), but one whose owner in this node's ring
// is from, the node that gave it away, stays until this node's ring
// changes or from comes back as another process, and from is not told
// this node's rounds are done meanwhile: should from own the key after
// all, it pulls its checks from here.
func (n *Node) Receive(from string, counters []*peerpb.CounterState) []*peerpb.Refusal {
	r := n.cluster.Ring()
	w := strayWatch{Store: n.store, ring: r, self: n.cluster.LocalMember().Name, from: from}
	refused := n.intake.Merge(&w, counters, n.now())
	if w.stray {
		n.roundAfterStrays()
	}
	if len(w.gave) > 0 {
		by, _ := r.Member(from)
		n.giftMu.Lock()
		for p := range w.gave {
			n.gifts[p] = gift{by: by, ring: r.ID()}
		}
		n.giftMu.Unlock()
	}
	for _, r := range refused {
		n.metrics.refused.WithLabelValues("received", checks.ReasonLabel(r.GetReason())).Inc()
	}
	if len(refused) > 0 {
		n.log.Warn("hand-off: counters refused", "from", from, "refused", len(refused), "of", len(counters),
			"first", refused[0].GetDetail())
	}
	n.metrics.counters.WithLabelValues("received").Add(float64(len(counters) - len(refused)))
	skip := make(map[int32]bool, len(refused))
	for _, r := range refused {
		skip[r.GetIndex()] = true
	}
	taken := 0
	for i, c := range counters {
		if !skip[int32(i)] {
			taken += len(c.GetCounter())
		}
	}
	n.metrics.bytes.WithLabelValues("received").Add(float64(taken))
	return refused
}

// Strays. A counter can arrive for a key this node does not own, its
// sender's ring and this node's differing. If this node's ring is ahead,
// no change may follow, and the counter, with the hits its side admitted,
// would stay here unseen by its owner: a heal would forget them. So a
// round follows strayDelay after such a counter arrives, and sends on what
// this node still holds but does not own; the delay outlasts gossip's lag.
// A counter whose key this node's ring gives to its sender (it is leaving,
// its ring ahead) starts none: sent back, it could be lost with it. See
// docs/design-cluster.md, "Strays".
const strayDelay = 2 * time.Second

// strayWatch is a Store whose Merge notes a counter merged for a key that
// self does not own in ring, and nor does from, the counters' sender
// (stray), and the partitions of those that from owns (gave).
type strayWatch struct {
	Store
	ring  *ring.Ring
	self  string
	from  string
	stray bool
	gave  map[int]bool
}

func (w *strayWatch) Merge(c limiter.Counter, now time.Time, skew time.Duration) error {
	err := w.Store.Merge(c, now, skew)
	owner, ok := w.ring.Owner(c.Key)
	switch {
	case err != nil || !ok || owner.Name == w.self:
	case owner.Name != w.from:
		w.stray = true
	default:
		if w.gave == nil {
			w.gave = map[int]bool{}
		}
		w.gave[ring.Partition(c.Key)] = true
	}
	return err
}

// giftsOf returns the gifts of ring r (see Receive), and forgets those of
// other rings.
func (n *Node) giftsOf(r *ring.Ring) map[int]gift {
	n.giftMu.Lock()
	defer n.giftMu.Unlock()
	id := r.ID()
	out := make(map[int]gift, len(n.gifts))
	for p, g := range n.gifts {
		if g.ring != id {
			delete(n.gifts, p)
			continue
		}
		out[p] = g
	}
	return out
}

// roundAfterStrays has Run hand off strayDelay from now, unless such a
// round is due already.
func (n *Node) roundAfterStrays() {
	if !n.strayed.CompareAndSwap(false, true) {
		return
	}
	time.AfterFunc(strayDelay, func() {
		n.strayed.Store(false)
		select {
		case n.changed <- struct{}{}:
		default:
		}
	})
}

type metrics struct {
	counters *prometheus.CounterVec
	refused  *prometheus.CounterVec
	pending  prometheus.Gauge
	waits    *prometheus.CounterVec
	bytes    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		counters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_handoff_counters_total",
			Help: "Counters handed to their new owner after a ring change and taken (direction=sent) or taken over from another node (direction=received).",
		}, []string{"direction"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_handoff_refused_total",
			Help: "Handed-off counters the new owner refused, by reason (unknown_version, invalid, unavailable): direction=sent counts this node's counters refused (and kept here), direction=received the counters this node refused.",
		}, []string{"direction", "reason"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_handoff_pending_counters",
			Help: "Counters this node holds for other owners after its last hand-off: refused, or not delivered. After the hand-off at shutdown, the counters lost when the node exits.",
		}),
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_handoff_waits_total",
			Help: "Checks for a key this node had just come to own that waited for the key's previous owner to hand its counter over, by how the wait ended: done (the counter is here), expired (--handoff-wait passed, or halfway to the check's deadline: the check is pulled, waits again or is refused), canceled (the caller gave up), arrived_late (after it expired, the check waited again and the counter arrived) or still_late (the second wait ran out too: the check is refused unavailable, charged nothing).",
		}, []string{"outcome"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_handoff_bytes_total",
			Help: "Bytes of the counter records in ringlimit_handoff_counters_total, by direction: what a hand-off moves, without the framing of the messages that carry it.",
		}, []string{"direction"}),
	}
	if reg != nil {
		reg.MustRegister(m.counters, m.refused, m.pending, m.waits, m.bytes)
	}
	for _, direction := range []string{"sent", "received"} {
		m.counters.WithLabelValues(direction) // exported as 0 before the first hand-off
		m.bytes.WithLabelValues(direction)
		for _, reason := range []peerpb.Refusal_Reason{peerpb.Refusal_UNKNOWN_VERSION, peerpb.Refusal_INVALID, peerpb.Refusal_UNAVAILABLE} {
			m.refused.WithLabelValues(direction, checks.ReasonLabel(reason))
		}
	}
	for _, outcome := range []string{"done", "expired", "canceled", "arrived_late", "still_late"} {
		m.waits.WithLabelValues(outcome)
	}
	return m
}
