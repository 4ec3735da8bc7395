// Package custody keeps track of where each key's counter is, and answers,
// for each check this node is about to decide, what its key needs first:
// its replica taken in as its counter, its counter awaited from the member
// that held it, a strict fence passed, a leaving node's hand-off held off
// while it decides, or the check sent to the member that has the counter.
// It is the one owner of those steps: package service asks it once per key
// (Prepare) and decides what is ready, and the hand-off of counters
// (package handoff) and their replicas (package replica) are its own.
//
// A counter is in one place at a time, as far as this node can tell: here
// (in the store), with the key's owner, on its way between the two (a
// hand-off round that has taken it out, or a member that has not said its
// round is done), or, for a key inherited from a member that crashed, in
// the replica its owner last sent. A check is decided here only on a
// counter that is here; see Prepare for each case.
package custody

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/handoff"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/replica"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/strict"
)

// Membership is what custody needs of the cluster (package cluster's
// Cluster): its ring, which member this node is, and whether it has joined
// the others yet, and whether it took over a name the cluster knew
// (Returning, for hand-off).
type Membership interface {
	Ring() *ring.Ring
	LocalMember() ring.Member
	Ready() bool
	Returning() []string
}

// Peers is what custody needs of the other nodes: package peer's Pool.
type Peers interface {
	handoff.Peers
	replica.Peers
	// HandOffLeft sends the node at addr this node's last word as it shuts
	// down (see SayLeft).
	HandOffLeft(ctx context.Context, addr, from string, ring uint64) error
}

// Fence is strict mode as custody needs it: *strict.Mode.
type Fence interface {
	On() bool
	Judge(r *limiter.Request, keepFence bool, cur *ring.Ring, self string, holds func(*limiter.Request) bool, now time.Time) strict.Verdict
}

// Watch is what custody needs to know of the other members' health:
// *heal.Node.
type Watch interface {
	// Suspect reports whether a forward to the member at addr failed
	// lately: a member that cannot be reached says nothing more.
	Suspect(addr string) bool
	// StandIn records a check decided here for the owner at addr, which
	// gets the counter back once it answers again: GaveBack signals
	// when, and Run runs a round of hand-off then.
	StandIn(addr string, at time.Time)
	GaveBack() <-chan struct{}
}

// Config configures a Custody. Store, Cluster, Fence and Watch are
// required; Peers once the cluster has other members.
type Config struct {
	// Store holds this node's counters; Replicas the replicas it keeps of
	// other owners' (nil: a store with defaults).
	Store, Replicas *limiter.Store
	Cluster         Membership
	Peers           Peers
	Fence           Fence
	Watch           Watch
	// MaxClockSkew bounds the times of the counters taken in
	// (checks.Intake).
	MaxClockSkew time.Duration
	// HandOffWait is how long, at most, a check for a key this node has
	// just come to own waits for the member that held its counter to
	// hand it over (handoff.Config.Wait); zero means checks never wait.
	HandOffWait time.Duration
	// ReplicateInterval is how often changed counters go to their heirs
	// (replica.Config.Interval); zero means none.
	ReplicateInterval time.Duration
	// HandedOff, if not nil, is given the records of the counters other
	// nodes took from this one (handoff.Config.HandedOff).
	HandedOff func(records [][]byte)
	// Holds, if not nil, is where custody looks whether a counter is here
	// instead of Store.Holds: a test watches the look with it.
	Holds func(r *limiter.Request) bool
	// Now is the clock strict mode's fences and received counters are
	// timed by; nil means time.Now.
	Now func() time.Time
	// Logger receives the logs; nil discards them.
	Logger *slog.Logger
	// Registerer receives the hand-off and replication metrics; nil
	// registers none.
	Registerer prometheus.Registerer
}

// Custody is one node's custody of its counters. It is safe for
// concurrent use; Run drives hand-off and replication.
type Custody struct {
	store    *limiter.Store
	replicas *limiter.Store
	cluster  Membership
	peers    Peers
	fence    Fence
	watch    Watch
	holds    func(r *limiter.Request) bool
	now      func() time.Time
	log      *slog.Logger
	handoff  *handoff.Node
	replica  *replica.Node
	// without caches rings without one member, or a few: failover's, and
	// those hand-off and replication build for the same ring, so that a
	// ring change builds each once.
	without ring.Heirs
	// leaving, once Leave is called, is the ring this node routes by: the
	// cluster's without this node (see Ring).
	leaving atomic.Pointer[leavingRing]
	leaveMu sync.Mutex // serializes the building of leaving rings
	// seen is the cluster's ring as of the last RingChanged.
	seen atomic.Pointer[ring.Ring]
	// deciding is read-held by each decision on the store, from the
	// instant Prepare reads whether this node is leaving until the store
	// has decided (see Prepare); Leave write-holds it to begin leaving.
	// Without it, a decision that began before Leave could reach the store
	// after the hand-off that follows took its counter, and start the
	// counter afresh, with the whole limit, beside the one handed off: the
	// checks after it found that fresh counter here and were decided on it
	// too, until the hand-off after leaving gossip took it.
	deciding sync.RWMutex
}

// New returns a Custody. It starts nothing.
func New(conf Config) *Custody {
	c := &Custody{store: conf.Store, replicas: conf.Replicas, cluster: conf.Cluster, peers: conf.Peers, fence: conf.Fence,
		watch: conf.Watch, holds: conf.Holds, now: conf.Now, log: conf.Logger}
	if c.replicas == nil {
		c.replicas = limiter.New(limiter.Config{})
	}
	if c.holds == nil {
		c.holds = c.store.Holds
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.handoff = handoff.New(handoff.Config{
		Store: c.store, Cluster: routing{c}, Peers: conf.Peers, MaxClockSkew: conf.MaxClockSkew, Wait: conf.HandOffWait,
		Now: c.now, HandedOff: conf.HandedOff, Logger: c.log, Registerer: conf.Registerer, Heirs: &c.without,
	})
	c.replica = replica.New(replica.Config{
		Store: c.store, Replicas: c.replicas, Cluster: routing{c}, Peers: conf.Peers, Interval: conf.ReplicateInterval,
		Intake: checks.Intake{MaxClockSkew: conf.MaxClockSkew}, Now: c.now, Logger: c.log,
		Registerer: conf.Registerer, Heirs: &c.without,
	})
	c.seen.Store(conf.Cluster.Ring())
	return c
}

// Run hands off after every ring change, and after an owner this node
// stood in for answers again (Watch.GaveBack), and replicates changed
// counters to their heirs, until ctx ends; if one of these fails, it
// stops the others and returns the error.
func (c *Custody) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return c.handoff.Run(ctx) })
	g.Go(func() error { return c.replica.Run(ctx) })
	g.Go(func() error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-c.watch.GaveBack():
				c.handoff.RingChanged() // no ring change: a round that finds the counters not this node's
			}
		}
	})
	return g.Wait()
}

// RingChanged tells custody that the ring changed, so that it gives the
// replicas of a member that came back (a new process under its name, or a
// member back in the ring) to it, hands off the counters it no longer
// owns, works out which keys it gained wait for their counter, promotes
// the replicas of keys it now owns and replicates every counter to its
// heir again. It does not wait for the network; the replicas it gives
// back are taken out of their store here, before the round of hand-off
// that sends them, which then tells the member it is done.
func (c *Custody) RingChanged() {
	r := c.cluster.Ring()
	if prev := c.seen.Swap(r); prev != nil && prev != r {
		c.replica.Return(prev, r)
	}
	c.handoff.RingChanged()
	c.replica.RingChanged()
}

// HandOff sends every counter this node holds but does not own to its
// owner now, and returns how many were taken (see handoff.Node.HandOff).
func (c *Custody) HandOff(ctx context.Context) int { return c.handoff.HandOff(ctx) }

// HandOffAll is the hand-off step of shutdown, after Leave: it hands off
// until every counter is taken or ctx ends, and returns how many were
// taken and how many are left, to be lost (see handoff.Node.HandOffAll).
func (c *Custody) HandOffAll(ctx context.Context) (sent, left int) { return c.handoff.HandOffAll(ctx) }

// Replicate is one round of replication (see replica.Node.Replicate); a
// test may call it instead of Run, never while Run runs.
func (c *Custody) Replicate(ctx context.Context) int { return c.replica.Replicate(ctx) }

// ReplicationLag is how long ago the last round of replication that
// delivered every batch began (see replica.Node.Lag).
func (c *Custody) ReplicationLag() time.Duration { return c.replica.Lag() }

// Received merges counters node from handed over (see
// handoff.Node.Receive).
func (c *Custody) Received(from string, counters []*peerpb.CounterState) []*peerpb.Refusal {
	return c.handoff.Receive(from, counters)
}

// HandOffDone takes node from's word that it has handed this node every
// counter it held for keys this node owns in the ring whose ID is id (see
// handoff.Node.HandOffDone).
func (c *Custody) HandOffDone(from string, id uint64) { c.handoff.HandOffDone(from, id) }

// Replicated keeps copies of counters that node from owns (see
// replica.Node.Receive).
func (c *Custody) Replicated(from string, counters []*peerpb.CounterState) []*peerpb.Refusal {
	return c.replica.Receive(from, counters)
}

// ExpireReservations drops the expired reservations of this node's
// counters and of the replicas it keeps.
func (c *Custody) ExpireReservations(now time.Time) {
	c.store.ExpireReservations(now)
	c.replicas.ExpireReservations(now)
}

// Heirs is the cache of rings without one member or a few, shared with
// failover, which looks for the heirs of the keys of an owner that cannot
// be reached.
func (c *Custody) Heirs() *ring.Heirs { return &c.without }

// Holds reports whether this node holds r's counter.
func (c *Custody) Holds(r *limiter.Request) bool { return c.holds(r) }

// Pulled reports whether this node holds the counter of r, a check a
// key's new owner pulls from it (see package service's plan): the counter
// this node holds, or the replica the key's owner sent it, which becomes
// its counter. A new owner pulls from this node when its ring had this
// node hold the key before: the key was this node's, or this node is its
// heir, which the owner asks when it comes back without its counter (it
// crashed and started again under its name, before this node's ring has
// seen it go and come back), and whose replica is then the key's counter.
func (c *Custody) Pulled(r *limiter.Request) bool {
	c.replica.PromoteKey(r)
	return c.holds(r)
}

// Pending returns the member this node waits for, in ring r, to hand over
// key's counter, if any (see handoff.Node.Pending).
func (c *Custody) Pending(r *ring.Ring, key string) (ring.Member, bool) {
	return c.handoff.Pending(r, key)
}

// AwaitJoin returns once this node has joined the cluster, for a check
// that comes before it has, and returns when the check began to wait
// (see handoff.Node.AwaitJoin).
func (c *Custody) AwaitJoin(ctx context.Context) time.Time { return c.handoff.AwaitJoin(ctx) }

// Promote takes in, as this node's counters, the replicas of the keys it
// inherited in ring r, the ring a request is routed by, from a member
// that left it (see replica.Node.Promote): call it before deciding
// anything by r.
func (c *Custody) Promote(r *ring.Ring) { c.replica.Promote(r) }

// Inherit is Promote of the ring this node routes by (see
// global.Config.Inherit).
func (c *Custody) Inherit() { c.replica.Promote(c.Ring()) }

// Await returns once key's counter is here as far as this node can tell,
// the replicas of keys it inherited taken in and a hand-off on its way
// awaited, for work on a key's counter other than a check (a lessee's
// reports, a reservation's settle; see handoff.Node.Await).
func (c *Custody) Await(ctx context.Context, key string) {
	r := c.Ring()
	c.replica.Promote(r)
	c.handoff.Await(ctx, r, key)
}
