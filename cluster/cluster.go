// Package cluster finds the other ringlimit nodes by gossip and keeps this
// node's consistent-hash ring up to date.
//
// A Cluster wraps hashicorp/memberlist; each node gossips its metadata
// (its listeners' addresses and its boot id). New only checks the
// configuration; Run creates the memberlist, joins through the Join
// addresses (retrying with backoff, and reconnecting to members that
// went), admits members (admit.go) and rebuilds the ring on every
// membership change, publishing an immutable *ring.Ring through an
// atomic pointer. memberlist's callbacks only signal Run, through a
// channel of capacity 1, so a burst of changes causes one rebuild. When
// Run's context is cancelled the node leaves the gossip and publishes a
// last ring without itself, where its counters are to be handed off. See
// docs/membership.md.
package cluster

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	sockaddr "github.com/hashicorp/go-sockaddr"
	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/ring"
)

// Defaults for the zero values of Config fields.
const (
	DefaultBindAddr     = ":7946"
	DefaultJoinRetry    = time.Second
	DefaultJoinRetryMax = 30 * time.Second
	DefaultLeaveTimeout = 5 * time.Second
	// LANSuspicionMaxTimeoutMult bounds how long a member that suspects
	// another waits, when no other member confirms the suspicion, before
	// it declares the suspect dead: this many times the shortest wait
	// (memberlist's SuspicionMult, 4, times its ProbeInterval, 1s, on a
	// LAN): 8s, where memberlist's LAN preset waits up to 24s. Confirmed
	// suspicions end sooner either way (4s with two confirmations). With
	// 24s, a survivor that missed the others' gossip of a crashed node's
	// death, or got one confirmation only, kept the dead node in its ring
	// for 11 to 24s (the chaos suite's kill -9, about one run in ten),
	// sending checks for its keys to failover all the while. A live node
	// refutes a suspicion as soon as the gossip reaches it, whatever the
	// wait, so the shorter one costs only a frozen or cut-off node being
	// declared dead sooner, which failover and hand-off are built for.
	LANSuspicionMaxTimeoutMult = 2

	// DefaultDeadNodeReclaimTime is how long after a node is declared dead
	// its name may rejoin from another address.
	DefaultDeadNodeReclaimTime = 3 * time.Second

	// DefaultReconnectInterval and DefaultReconnectTimeout are the zero
	// values' Config.ReconnectInterval and ReconnectTimeout: Serf's
	// reconnect, with a shorter interval (Serf's is 30s), since a member
	// found again late owns its keys in no ring meanwhile.
	DefaultReconnectInterval = 10 * time.Second
	DefaultReconnectTimeout  = 24 * time.Hour
)

// maxGone bounds the members Run keeps trying to reconnect to, and
// reconnectBatch those it tries at each ReconnectInterval, the ones tried
// least recently first.
const (
	maxGone        = 256
	reconnectBatch = 3
)

// keepGone is how long Members keeps reporting a node that died or left.
const keepGone = 5 * time.Minute

// LeftGrace is how long after a node left (or was declared dead) Member
// still says it is one: a node shutting down leaves the gossip first, so
// that others stop routing to it, and then hands off its counters and sends
// its last GLOBAL report, which must not be refused.
const LeftGrace = 2 * time.Minute

// FailGrace is how long a member that gossip declares dead, or that
// left, stays in the ring: a ring change is taken back only by another,
// and each moves keys, while a heal brings declarations of death that
// gossip takes back within a fraction of a second. Meanwhile the checks
// sent to a member really gone fail over to their heirs, and one that
// leaves keeps its peer port open, relaying. See docs/design-cluster.md,
// "Membership and the ring".
const FailGrace = time.Second

// Config configures a Cluster. Only NodeName and PeerAddr are required.
type Config struct {
	// NodeName is this node's unique name in the cluster.
	NodeName string

	// BindAddr is the host:port memberlist listens on, for TCP and UDP.
	// An empty host means all interfaces; port 0 means a port chosen by the
	// kernel (see GossipAddr). Empty means DefaultBindAddr.
	BindAddr string

	// AdvertiseAddr is the address other nodes use to reach this one, as a
	// host or host:port; a host name is resolved once, by Run. The port
	// defaults to the bound port. Empty means the bound IP or, when bound to
	// all interfaces, a private IP (memberlist's choice), else the first
	// non-loopback IP, else 127.0.0.1 (see defaultAdvertiseIP).
	AdvertiseAddr string

	// Join lists the nodes to join through, each a host:port or a DNS name
	// with an optional port (the default is this node's bound port). A name
	// that resolves to several addresses, such as a Kubernetes headless
	// Service, joins them all. Names are resolved again on every attempt,
	// so nodes that start late are found. Empty means this node deliberately
	// runs alone until another node joins it. With Join, the node is Ready
	// only once a join has reached another node (see Bootstrap).
	Join []string

	// Bootstrap says this node may start a new cluster: with Join, it is
	// Ready alone once its first join has reached no other node (it keeps
	// trying, as a node left alone does), where a node without Bootstrap
	// waits, not Ready, until a join reaches another node, so that no node
	// is a cluster of one by mistake. Without Join it changes nothing.
	Bootstrap bool

	// ReconnectInterval is how often Run tries to join again a few of the
	// members that were declared dead or left, and ReconnectTimeout how
	// long after that it gives one up, as Serf's reconnect does: memberlist
	// stops gossiping to a dead member after GossipToTheDeadTime and then
	// forgets it, so a member restarted at its address after that without
	// a Join that answers (a partition healed late, a node restarted with
	// its join targets down) would otherwise stay a cluster apart. Only
	// members that were in this node's ring are tried. Zero means
	// DefaultReconnectInterval and DefaultReconnectTimeout.
	ReconnectInterval time.Duration
	ReconnectTimeout  time.Duration

	// PeerAddr is the host:port of this node's peer gRPC listener,
	// GRPCAddr that of its client gRPC listener and HTTPAddr that of its
	// HTTP listener (where operators' tools read its metrics). All are
	// gossiped to the other nodes. An empty or unspecified host (":8082")
	// is replaced by the advertised IP. PeerAddr is required.
	PeerAddr string
	GRPCAddr string
	HTTPAddr string

	// JoinRetry is the wait before the second join attempt; it doubles
	// after each failure up to JoinRetryMax. Zero means DefaultJoinRetry
	// and DefaultJoinRetryMax.
	JoinRetry    time.Duration
	JoinRetryMax time.Duration

	// LeaveTimeout bounds the wait for the leave message to reach another
	// node on shutdown. Zero means DefaultLeaveTimeout.
	LeaveTimeout time.Duration

	// Keys encrypt and authenticate gossip (AES-GCM; each 16, 24 or 32
	// bytes). The first key encrypts what this node sends; every key
	// decrypts, so a key rotates without downtime: add the new key second
	// on every node, then make it first everywhere, then drop the old one.
	// A node without a key the others use cannot join them, nor they it.
	// Nil means plaintext gossip, which anyone who can reach the gossip
	// port may join.
	Keys [][]byte

	// Memberlist is the memberlist preset to start from; nil means
	// memberlist.DefaultLANConfig() with SuspicionMaxTimeoutMult set to
	// LANSuspicionMaxTimeoutMult. Tests use memberlist.DefaultLocalConfig().
	// Run copies it and sets Name, BindAddr, BindPort, AdvertiseAddr,
	// AdvertisePort, Delegate, Events, LogOutput and Logger itself, and
	// Keyring, SecretKey and GossipVerify* from Keys.
	Memberlist *memberlist.Config

	// OnChange, if not nil, is called by the Run goroutine each time it
	// publishes a ring with different members, after Ring returns the new
	// ring. Calls are never concurrent. It must return quickly, because
	// membership processing waits for it: to do real work, signal your own
	// loop. The last call comes while Run shuts down, with a ring without
	// this node.
	OnChange func(old, new *ring.Ring)

	// Admit checks that the member name, which gossip says serves its peer
	// port at peerAddr, is who it says: package node dials the address
	// over mutual TLS and checks that the certificate presented names the
	// member. A member enters the ring only once Admit returned nil for
	// its current peer address, on this node (see admission); Run calls
	// it from goroutines of its own, at most 16 at once, with a context
	// that ends within 5s. An error marked with Refused is a verdict on
	// the member's identity, checked again slowly; any other is a check
	// that could not be made, retried within seconds (see admission). Nil
	// admits every member gossip announces, as without peer TLS nothing
	// can be checked.
	Admit func(ctx context.Context, name, peerAddr string) error

	// AdmitGrace is how long an alive member may stay unadmitted before
	// Readiness reports it: a member that has just started may not answer
	// on its peer port for a moment. Zero means DefaultAdmitGrace.
	AdmitGrace time.Duration

	// Logger receives this package's logs and memberlist's. Nil discards them.
	Logger *slog.Logger

	// Registerer, if not nil, gets this cluster's metrics.
	Registerer prometheus.Registerer
}

// Cluster is this node's membership in the cluster and its current ring.
// Its methods are safe for concurrent use. Run owns every goroutine and the
// memberlist; the other methods only read published snapshots.
type Cluster struct {
	conf      Config // defaults applied
	bindHost  string
	bindPort  int
	log       *slog.Logger
	metrics   *metrics
	events    *events
	delegate  *delegate
	conflicts *conflicts
	admission *admission // owned by the Run goroutine
	// boot is this process's boot id, which it gossips (see
	// ring.Member.Boot).
	boot string
	// admitBy is, from the end of a node's first join until it is ready,
	// when it stops waiting for the first checks of the members the join
	// brought (see finishJoin); zero otherwise. Owned by the Run goroutine.
	admitBy time.Time
	// joined says the node's first join has succeeded (reached another
	// node, or none with Bootstrap): finishJoin, also called as admission
	// verdicts come in and on admission's tick, does nothing before. Owned
	// by the Run goroutine.
	joined bool
	// gone are the members Run reconnects to (see
	// Config.ReconnectInterval). Owned by the Run goroutine.
	gone map[string]goneMember

	view    atomic.Pointer[view]
	ready   atomic.Bool
	started atomic.Bool
	// returning holds what Returning reports, set by Run as the node's
	// first join succeeds.
	returning atomic.Pointer[[]string]
	// waiting says why the node is not Ready, while it is not: set by Run.
	waiting atomic.Pointer[string]
}

// goneMember is a member declared dead or that left, which Run tries to
// join again.
type goneMember struct {
	addr  string    // its gossip address
	since time.Time // when it went
	tried time.Time // when Run last tried it; zero if never
}

// view is what Run publishes after each membership change.
type view struct {
	ring    *ring.Ring
	local   ring.Member
	gossip  string
	members []MemberInfo
	// admitted are the names admission has admitted (alive or gone); nil
	// when every member is (Config.Admit is nil).
	admitted map[string]bool
	// unadmitted are the alive members admission has not admitted, with
	// when their check began and its last failure; admittedOther says a
	// member other than this node has been admitted since Run started
	// (see Readiness).
	unadmitted    []unadmitted
	admittedOther bool
}

// unadmitted is an alive member left out of the ring by admission.
type unadmitted struct {
	name, peerAddr string
	since          time.Time
	note           string // as MemberInfo.Admission
}

// MemberInfo describes a member as this node sees it. (Package api's
// Member is its JSON form on GET /v1/members.)
type MemberInfo struct {
	Name       string
	GossipAddr string
	PeerAddr   string
	GRPCAddr   string
	HTTPAddr   string // empty for a node too old to gossip it
	State      State
	Share      float64 // fraction of the ring's partitions; 0 when not in the ring
	// Admission is empty for a member in the ring, or one that is not
	// alive; else it says why admission leaves the member out ("not
	// admitted: ..." with the reason, "not admitted, retrying ..." while
	// its peer port does not answer the check).
	Admission string
}

// State is a member's state as this node sees it.
type State string

// The member states. memberlist tells its event delegates only that a node
// joined, changed or went away, so a suspect node shows as alive until it is
// declared dead, and a node that left on purpose shows as dead like one that
// failed.
const (
	Alive State = "alive"
	Dead  State = "dead"
)

// New checks conf and returns a Cluster. It starts nothing: Run does.
func New(conf Config) (*Cluster, error) {
	if conf.NodeName == "" {
		return nil, errors.New("cluster config: empty node name")
	}
	if conf.PeerAddr == "" {
		return nil, errors.New("cluster config: empty peer address")
	}
	if conf.BindAddr == "" {
		conf.BindAddr = DefaultBindAddr
	}
	host, port, err := splitHostPort(conf.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("cluster config: bind address: %w", err)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	if conf.AdvertiseAddr != "" {
		if _, _, err := splitAdvertise(conf.AdvertiseAddr); err != nil {
			return nil, fmt.Errorf("cluster config: advertise address: %w", err)
		}
	}
	// The metadata must fit memberlist's limit with the longest IP filled in.
	const longestIP = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
	boot := newBoot()
	if _, err := encodeMeta(metaAt(conf, boot, longestIP)); err != nil {
		return nil, fmt.Errorf("cluster config: %w", err)
	}
	for i, k := range conf.Keys {
		if err := memberlist.ValidateKey(k); err != nil {
			return nil, fmt.Errorf("cluster config: gossip key %d: %w", i+1, err)
		}
	}
	conf.Keys = slices.Clone(conf.Keys)
	if conf.JoinRetry <= 0 {
		conf.JoinRetry = DefaultJoinRetry
	}
	if conf.JoinRetryMax <= 0 {
		conf.JoinRetryMax = DefaultJoinRetryMax
	}
	conf.JoinRetryMax = max(conf.JoinRetryMax, conf.JoinRetry)
	if conf.LeaveTimeout <= 0 {
		conf.LeaveTimeout = DefaultLeaveTimeout
	}
	conf.Join = slices.Clone(conf.Join)
	if conf.AdmitGrace <= 0 {
		conf.AdmitGrace = DefaultAdmitGrace
	}
	if conf.ReconnectInterval <= 0 {
		conf.ReconnectInterval = DefaultReconnectInterval
	}
	if conf.ReconnectTimeout <= 0 {
		conf.ReconnectTimeout = DefaultReconnectTimeout
	}
	log := conf.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(conf.Registerer)
	if err != nil {
		return nil, err
	}

	c := &Cluster{
		conf:      conf,
		bindHost:  host,
		bindPort:  port,
		log:       log,
		metrics:   m,
		events:    newEvents(conf.NodeName, boot),
		delegate:  &delegate{},
		conflicts: &conflicts{self: conf.NodeName},
		admission: newAdmission(),
		gone:      map[string]goneMember{},
		boot:      boot,
	}
	c.setWaiting("starting: gossip has not started yet")
	local := ring.Member{Name: conf.NodeName, PeerAddr: conf.PeerAddr, GRPCAddr: conf.GRPCAddr, Boot: boot}
	r := ring.New(local)
	var admitted map[string]bool
	if conf.Admit != nil {
		admitted = map[string]bool{conf.NodeName: true}
	}
	c.view.Store(&view{
		admitted: admitted,
		ring:     r,
		local:    local,
		members: []MemberInfo{{
			Name:     local.Name,
			PeerAddr: local.PeerAddr,
			GRPCAddr: local.GRPCAddr,
			HTTPAddr: conf.HTTPAddr,
			State:    Alive,
			Share:    1,
		}},
	})
	m.members.Set(1)
	return c, nil
}

// Ring returns the current ring. It is never nil: before Run has built one,
// it holds only this node, with PeerAddr and GRPCAddr as configured. After
// Run returns, it holds the other members as last seen.
func (c *Cluster) Ring() *ring.Ring { return c.view.Load().ring }

// Ready reports whether this node is part of the cluster: Run has started
// gossip and either joined through a Join address, reaching another node,
// at least once, or runs alone by design (no Join addresses, or Bootstrap
// and no other node answered). It stays true if the node later finds
// itself alone (it keeps trying to rejoin meanwhile), and turns false when
// Run begins to shut down. Readiness says more.
func (c *Cluster) Ready() bool { return c.ready.Load() }

// Returning reports, for a process that joined under a name the cluster
// knew from an earlier process (a node restarted after a crash, an OOM
// kill or a rolling update; memberlist remembers a departed node for a
// while, with its boot id), the other members its join found alive: they
// may hold its keys' counters or their replicas, which package handoff
// waits for before the node decides those keys, however its first rings
// were built. A member gossip has since declared dead or gone is left
// out: it will not come into the ring to be waited for. It is nil for a
// process under a new name, or before the first join.
func (c *Cluster) Returning() []string {
	p := c.returning.Load()
	if p == nil {
		return nil
	}
	alive := make([]string, 0, len(*p))
	for _, name := range *p {
		if n, ok := c.events.get(name); ok && n.alive {
			alive = append(alive, name)
		}
	}
	return alive
}

// Readiness reports whether this node may take client traffic, with one
// line a person can act on: while not, why; while ready, a warning, or ""
// when there is nothing to say. A node is not ready while it is not
// Ready, nor while gossip shows members it has not admitted for
// Config.AdmitGrace and it has admitted no other member since it started: it
// would decide every key alone, beside a cluster that decides them too
// (two nodes refusing each other's certificates; a new pod whose
// certificate the others refuse, which so stops a rollout at that pod).
// A node that has admitted another member stays ready with a warning
// naming the members it does not admit, so that a stranger announcing
// itself by gossip, or one bad new pod, takes no running node out of
// service.
func (c *Cluster) Readiness() (ready bool, why string) {
	ready, why = c.readiness()
	return ready, strings.Join(strings.Fields(why), " ") // one line: errors such as memberlist's span several
}

func (c *Cluster) readiness() (ready bool, why string) {
	if !c.Ready() {
		return false, "not ready: " + *c.waiting.Load()
	}
	v := c.view.Load()
	var late []unadmitted
	now := time.Now()
	for _, u := range v.unadmitted {
		if now.Sub(u.since) >= c.conf.AdmitGrace {
			late = append(late, u)
		}
	}
	if len(late) == 0 {
		return true, ""
	}
	u := late[0]
	more := ""
	if len(late) > 1 {
		more = fmt.Sprintf(" (and %d more members)", len(late)-1)
	}
	what := fmt.Sprintf("member %s (peer %s) %s%s", u.name, u.peerAddr, u.note, more)
	if !v.admittedOther {
		return false, "not ready: " + what + "; this node admits no other member, so it would decide every key alone"
	}
	return true, "warning: " + what + "; it owns no keys in this node's ring"
}

// setWaiting records why the node is not Ready (see Readiness).
func (c *Cluster) setWaiting(why string) { c.waiting.Store(&why) }

// LocalMember returns this node as the ring sees it. Once Run has started,
// its addresses carry the advertised IP in place of an empty host.
func (c *Cluster) LocalMember() ring.Member { return c.view.Load().local }

// GossipAddr returns the host:port this node advertises for gossip, or ""
// before Run has started memberlist. With port 0 in BindAddr, it is the way
// to learn the chosen port.
func (c *Cluster) GossipAddr() string { return c.view.Load().gossip }

// Member reports whether name is a member of the cluster: admitted (see
// Config.Admit) and alive as far as this node knows, or gone for less than
// LeftGrace. Names this node never heard of through gossip are not
// members; so, with Config.Keys, only nodes holding the gossip key can be,
// and with Config.Admit only those whose peer port proved the name.
func (c *Cluster) Member(name string) bool {
	if a := c.view.Load().admitted; a != nil && !a[name] {
		return false
	}
	n, ok := c.events.get(name)
	return ok && (n.alive || time.Since(n.change) < LeftGrace)
}

// Names returns the names Member reports true for.
func (c *Cluster) Names() []string {
	var out []string
	for _, m := range c.view.Load().members {
		if c.Member(m.Name) {
			out = append(out, m.Name)
		}
	}
	return out
}

// Members returns every node this node knows of, sorted by name, including
// nodes that went away in the last few minutes. The slice is a copy.
func (c *Cluster) Members() []MemberInfo { return slices.Clone(c.view.Load().members) }

// joinWaitOnLeave bounds how long Run, leaving, waits for a join attempt
// in flight (a join, or a reconnect) to return.
const joinWaitOnLeave = 500 * time.Millisecond

// Run starts gossip, joins the cluster and keeps the ring up to date until
// ctx is cancelled. If the first join finds this node's name held by
// another live member, Run shuts gossip down without leaving and returns
// an error wrapping ErrNameTaken; the node was never Ready. When ctx is
// cancelled it leaves the cluster (waiting up to LeaveTimeout for the news
// to spread), shuts memberlist down, publishes the ring of the remaining
// members, and returns ctx.Err() once its goroutines are done: a join
// attempt in flight at that moment delays the return by at most
// joinWaitOnLeave. Run may be called once.
func (c *Cluster) Run(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("run cluster: already run")
	}
	ml, err := c.create(ctx)
	if err != nil {
		c.setWaiting("gossip did not start: " + err.Error())
		return err
	}
	c.rebuild(ctx)

	join := len(c.conf.Join) > 0
	joinList := strings.Join(c.conf.Join, ",")
	if !join {
		c.ready.Store(true)
		c.log.Info("no join addresses: running alone until others join", "gossip_addr", c.GossipAddr())
	} else {
		c.setWaiting("joining through --join " + joinList + ": first attempt in progress")
	}
	backoff := c.conf.JoinRetry
	retry := time.NewTimer(0) // first attempt at once
	defer retry.Stop()
	armed := join
	if !armed {
		retry.Stop()
	}
	joining := false
	joined := make(chan error, 1)
	// A node restarted under its name at a new address (a crashed pod with
	// a new IP) is refused by members that still hold its old, dead entry
	// until their DeadNodeReclaimTime has passed. Joining again after that
	// pushes this node's state to them once more, so they take it.
	confirms := 2
	reclaim := DefaultDeadNodeReclaimTime
	if c.conf.Memberlist != nil && c.conf.Memberlist.DeadNodeReclaimTime > 0 {
		reclaim = c.conf.Memberlist.DeadNodeReclaimTime
	}
	rearm := func() time.Duration {
		d := backoff + rand.N(backoff/5+1) // jitter, so nodes do not retry in step
		backoff = min(2*backoff, c.conf.JoinRetryMax)
		retry.Reset(d)
		armed = true
		return d
	}

	// Admission retries members that failed on this tick.
	tick := time.NewTicker(admitRetry)
	defer tick.Stop()
	if c.conf.Admit == nil {
		tick.Stop()
	}
	reconnect := time.NewTicker(c.conf.ReconnectInterval)
	defer reconnect.Stop()
	reconnecting := false
	reconnected := make(chan []string, 1)

	for {
		select {
		case <-ctx.Done():
			c.ready.Store(false)
			c.setWaiting("leaving the cluster: this node is shutting down")
			if err := ml.Leave(c.conf.LeaveTimeout); err != nil {
				c.log.Warn("leave cluster", "err", err)
			}
			if err := ml.Shutdown(); err != nil {
				c.log.Warn("shut down gossip", "err", err)
			}
			// A join in flight (a node that found itself alone as the
			// others left, as when a whole cluster stops at once) can dial
			// stopped nodes for memberlist's TCPTimeout each; with gossip
			// shut down it can do nothing more, so it is not waited for
			// beyond joinWaitOnLeave: it ends on its own. So for a
			// reconnect.
			timer := time.NewTimer(joinWaitOnLeave)
			for joining || reconnecting {
				select {
				case <-joined:
					joining = false
				case <-reconnected:
					reconnecting = false
				case <-timer.C:
					c.log.Info("left with a join attempt still in flight; it ends on its own")
					joining, reconnecting = false, false
				}
			}
			timer.Stop()
			for ; c.admission.inFlight > 0; c.admission.inFlight-- {
				<-c.admission.verdicts // the checks end with ctx
			}
			c.rebuild(nil) // without this node: it has left
			c.log.Info("left cluster")
			return ctx.Err()

		case v := <-c.admission.verdicts:
			c.takeVerdict(v, time.Now())
			c.rebuild(ctx) // publishes the verdict: the ring, or why not (MemberInfo.Admission)
			c.finishJoin(ctx)

		case <-tick.C:
			c.rebuild(ctx)
			c.finishJoin(ctx)

		case <-c.events.changed:
			c.rebuild(ctx)
			if join && !joining && !armed && c.alone() {
				c.log.Warn("alone in the cluster: trying to rejoin", "join", c.conf.Join)
				backoff = c.conf.JoinRetry
				rearm()
			}

		case <-reconnect.C:
			if reconnecting {
				break
			}
			if addrs := c.toReconnect(time.Now()); len(addrs) > 0 {
				reconnecting = true
				go func() {
					n, _ := ml.Join(addrs) // each that does not answer is tried again later
					if n == 0 {
						addrs = nil
					}
					reconnected <- addrs
				}()
			}

		case addrs := <-reconnected:
			reconnecting = false
			if addrs != nil {
				c.log.Info("reconnected to members declared dead or gone", "tried", addrs)
			}

		case <-retry.C:
			armed = false
			joining = true
			c.metrics.joinAttempts.Inc()
			go func() {
				n, err := ml.Join(c.conf.Join)
				if n == 0 && err == nil {
					err = errors.New("no addresses")
				}
				joined <- err
			}()

		case err := <-joined:
			joining = false
			// Whatever the join's merge brought is recorded by now: the
			// ring it held back goes out before the node says it is ready
			// (a check a node not ready decides waits for its ring; see
			// package handoff).
			c.events.merged()
			if err == nil && !c.ready.Load() {
				if names := c.events.returnedTo(); names != nil && c.returning.Load() == nil {
					c.returning.Store(&names)
					c.log.Info("this name's earlier process is known to the cluster: taking its keys back from their heirs", "members", names)
				}
				if err := c.checkName(ml); err != nil {
					// No Leave: it would tell the others that the member
					// holding this name has left.
					if err := ml.Shutdown(); err != nil {
						c.log.Warn("shut down gossip", "err", err)
					}
					c.setWaiting(err.Error())
					return err
				}
			}
			c.rebuild(ctx) // the join's events may still be waiting in c.events.changed
			reached := err == nil && !c.alone()
			switch {
			case reached:
				if !c.ready.Load() && c.conf.Admit != nil {
					c.admitBy = time.Now().Add(admitTimeout)
					c.setWaiting("joined; checking the peer certificates of the members the join brought")
				}
				c.joined = true
				if confirms > 0 {
					confirms--
					retry.Reset(reclaim + time.Second)
					armed = true
				} else {
					backoff = c.conf.JoinRetry
				}
			case c.joined:
				// Ready already: alone again, or trying to be found by a
				// cluster it lost. Keep looking, more slowly each time.
				if err != nil {
					c.log.Warn("join cluster", "join", c.conf.Join, "err", err, "retry_in", backoff)
				}
				rearm()
			case c.conf.Bootstrap:
				c.log.Info("no other node answered --join: starting a new cluster as its first node (--bootstrap)", "join", c.conf.Join, "err", err)
				c.joined = true
				rearm() // and keep looking, as a node left alone does
			default:
				why := "only this node answered"
				if err != nil {
					why = "no node answered (" + err.Error() + ")"
				}
				d := rearm()
				c.setWaiting(fmt.Sprintf("not joined: %s through --join %s; trying again in %v (only the node named by --bootstrap starts a new cluster alone)",
					why, joinList, d.Round(100*time.Millisecond)))
				c.log.Warn("not joined: waiting for another node to answer --join", "join", c.conf.Join, "err", err, "retry_in", d)
			}
			c.finishJoin(ctx)
		}
	}
}

// finishJoin says the node is ready once it has joined and, with
// Config.Admit, once the first check of every member the join brought has
// ended or admitTimeout has passed since (admitBy). Until then the ring is
// held back (see rebuild): members are admitted one check at a time, and a
// ring of some of them would make the node take keys it holds in the
// whole ring for ones it held already, and wait for none of their
// counters (package handoff). A node not ready holds the checks sent to it
// until it has its ring, as one that has not joined does. It does nothing
// before the first join ends, nor once the node is ready.
func (c *Cluster) finishJoin(ctx context.Context) {
	if !c.joined {
		return // a verdict or a tick while the first join is in flight, or has failed
	}
	if !c.admitBy.IsZero() {
		if c.admission.firstPending() && time.Now().Before(c.admitBy) {
			return
		}
		c.admitBy = time.Time{}
		c.rebuild(ctx)
	}
	if !c.ready.Swap(true) {
		c.log.Info("joined cluster", "members", c.Ring().Len())
	}
}

// create starts memberlist and publishes this node's metadata with the
// advertised IP filled in.
func (c *Cluster) create(ctx context.Context) (*memberlist.Memberlist, error) {
	var mc memberlist.Config
	if c.conf.Memberlist != nil {
		mc = *c.conf.Memberlist
	} else {
		mc = *memberlist.DefaultLANConfig()
		mc.SuspicionMaxTimeoutMult = LANSuspicionMaxTimeoutMult
	}
	mc.Name = c.conf.NodeName
	mc.BindAddr = c.bindHost
	mc.BindPort = c.bindPort
	mc.AdvertiseAddr = ""
	mc.AdvertisePort = c.bindPort // memberlist uses the chosen port when BindPort is 0
	if c.conf.AdvertiseAddr == "" && (c.bindHost == "" || net.ParseIP(c.bindHost).IsUnspecified()) {
		mc.AdvertiseAddr = defaultAdvertiseIP(sockaddr.GetPrivateIP, upInterfaceAddrs)
	}
	if c.conf.AdvertiseAddr != "" {
		host, port, _ := splitAdvertise(c.conf.AdvertiseAddr) // checked by New
		ip, err := resolveIP(ctx, host)
		if err != nil {
			return nil, fmt.Errorf("start gossip: advertise address: %w", err)
		}
		mc.AdvertiseAddr = ip.String()
		if port != 0 {
			mc.AdvertisePort = port
		}
	}
	if mc.DeadNodeReclaimTime == 0 {
		// A crashed pod comes back under its name at a new address; without
		// this, memberlist refuses it until the dead entry is reaped (tens
		// of seconds), while both sides own the same keys.
		mc.DeadNodeReclaimTime = DefaultDeadNodeReclaimTime
	}
	mc.SecretKey, mc.Keyring = nil, nil
	if len(c.conf.Keys) > 0 {
		kr, err := memberlist.NewKeyring(c.conf.Keys, c.conf.Keys[0])
		if err != nil {
			return nil, fmt.Errorf("start gossip: %w", err) // checked by New
		}
		mc.Keyring = kr
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
	mc.Delegate = c.delegate
	mc.Events, mc.Merge = c.events, c.events
	mc.Conflict = c.conflicts
	// One logger for memberlist and its transport.
	mc.LogOutput = nil
	mc.Logger = log.New(logWriter{log: c.log.With("component", "memberlist")}, "", log.LstdFlags)
	// memberlist makes its own transport only when none is given; ours is
	// the same one, counting bytes (ringlimit_gossip_bytes_total), so
	// Create no longer learns the port the kernel chose: it is set here.
	tr, port, err := newTransport(c.bindHost, c.bindPort, c.metrics, &mc)
	if err != nil {
		return nil, fmt.Errorf("start gossip: %w", err)
	}
	mc.Transport, mc.BindPort = tr, port
	if mc.AdvertisePort == 0 {
		mc.AdvertisePort = port
	}

	m, err := encodeMeta(metaAt(c.conf, c.boot, ""))
	if err != nil {
		return nil, err // checked by New
	}
	c.delegate.meta.Store(&m)
	ml, err := memberlist.Create(&mc)
	if err != nil {
		_ = tr.Shutdown()
		return nil, fmt.Errorf("start gossip: %w", err)
	}

	// memberlist has told the events delegate about this node, with the
	// address it advertises.
	self, ok := c.events.get(c.conf.NodeName)
	if !ok {
		_ = ml.Shutdown()
		return nil, errors.New("start gossip: memberlist did not report this node")
	}
	local := ring.Member{
		Name:     c.conf.NodeName,
		PeerAddr: withHost(c.conf.PeerAddr, self.ip),
		GRPCAddr: withHost(c.conf.GRPCAddr, self.ip),
		Boot:     c.boot,
	}
	m, err = encodeMeta(metaAt(c.conf, c.boot, self.ip))
	if err != nil {
		_ = ml.Shutdown()
		return nil, err
	}
	c.delegate.meta.Store(&m)
	// This waits only if another node has joined us already. The update
	// spreads by gossip even if the wait times out, and the others fill in
	// an empty host themselves, so a timeout is not fatal.
	if err := ml.UpdateNode(c.conf.LeaveTimeout); err != nil {
		c.log.Warn("publish node metadata", "err", err)
	}
	v := *c.view.Load()
	v.local, v.gossip = local, self.addr
	c.view.Store(&v)
	c.log.Info("gossip started", "node", local.Name, "gossip_addr", self.addr, "peer_addr", local.PeerAddr)
	return ml, nil
}

// rebuild publishes a new view from the events delegate's nodes, and a new
// ring if the members in it changed; with Config.Admit, only admitted
// members are in the ring, and the checks of the others that are due are
// started with ctx (none if ctx is nil: Run is leaving). Only the Run
// goroutine calls it.
func (c *Cluster) rebuild(ctx context.Context) {
	now := time.Now()
	nodes, merging := c.events.snapshot(now, keepGone)
	old := c.view.Load()
	members := make([]ring.Member, 0, len(nodes))
	infos := make([]MemberInfo, 0, len(nodes))
	var admitted map[string]bool
	want, known := map[string]string{}, map[string]bool{}
	if c.conf.Admit != nil {
		admitted = map[string]bool{c.conf.NodeName: true}
	}
	for _, n := range nodes {
		known[n.name] = true
		info := MemberInfo{Name: n.name, GossipAddr: n.addr, State: Dead}
		if n.alive {
			info.State = Alive
		}
		m, err := decodeMeta(n.meta)
		if err == nil {
			info.PeerAddr = withHost(m.Peer, n.ip)
			info.GRPCAddr = withHost(m.GRPC, n.ip)
			info.HTTPAddr = withHost(m.HTTP, n.ip)
		}
		if info.State != Alive && err == nil && ctx != nil && now.Sub(n.change) < FailGrace && old.ring.Has(n.name) {
			// Declared dead only just now: kept in the ring for FailGrace
			// (the others see it dead all the same, and check it as any
			// member they cannot reach).
			members = append(members, ring.Member{Name: n.name, PeerAddr: info.PeerAddr, GRPCAddr: info.GRPCAddr, Boot: m.Boot})
		}
		if info.State == Alive {
			switch {
			case err != nil:
				c.log.Warn("node left out of the ring", "node", n.name, "err", err)
				info.Admission = "not in the ring: " + err.Error()
			case admitted != nil && n.name != c.conf.NodeName && !c.admission.admitted(n.name, info.PeerAddr):
				want[n.name] = info.PeerAddr
				if c.admission.kept(n.name, info.PeerAddr) {
					members = append(members, ring.Member{Name: n.name, PeerAddr: info.PeerAddr, GRPCAddr: info.GRPCAddr, Boot: m.Boot})
				}
			default:
				members = append(members, ring.Member{Name: n.name, PeerAddr: info.PeerAddr, GRPCAddr: info.GRPCAddr, Boot: m.Boot})
			}
		}
		if admitted != nil && (c.admission.admitted(n.name, info.PeerAddr) || c.admission.kept(n.name, info.PeerAddr)) {
			admitted[n.name] = true
		}
		c.trackGone(n, admitted == nil || admitted[n.name], now)
		infos = append(infos, info)
	}
	var late []unadmitted
	if admitted != nil && ctx != nil {
		c.startAdmission(ctx, want, known, now)
		for i := range infos {
			addr, ok := want[infos[i].Name]
			if !ok {
				continue
			}
			infos[i].Admission = c.admission.note(infos[i].Name, addr)
			if !c.admission.kept(infos[i].Name, addr) {
				late = append(late, unadmitted{name: infos[i].Name, peerAddr: addr, since: c.admission.states[infos[i].Name].since, note: infos[i].Admission})
			}
		}
	}
	c.metrics.unadmitted.Set(float64(len(want)))

	r := old.ring
	// A join's merge in progress holds the ring back (events.NotifyMerge),
	// as do the first admission checks of the members a first join brought
	// (finishJoin), but not as this node leaves (ctx nil): its last ring is
	// without it. Those checks hold it from the end of the merge: Join
	// then goes on to the next --join addresses, for a TCP timeout each
	// where one does not answer, while the others already route keys here.
	firstChecks := c.conf.Admit != nil && !c.joined && !c.ready.Load() && c.admission.firstPending()
	held := (merging || firstChecks || !c.admitBy.IsZero()) && ctx != nil
	changed := !held && !slices.Equal(r.Members(), members) // both sorted by name
	if changed {
		r = ring.New(members...)
	}
	shares := r.Shares()
	for i := range infos {
		infos[i].Share = shares[infos[i].Name]
	}
	c.view.Store(&view{ring: r, local: old.local, gossip: old.gossip, members: infos, admitted: admitted,
		unadmitted: late, admittedOther: c.admission.other})
	if !changed {
		return
	}
	c.metrics.rebuilds.Inc()
	c.metrics.members.Set(float64(r.Len()))
	c.log.Info("ring rebuilt", "members", r.Len())
	if c.conf.OnChange != nil {
		c.conf.OnChange(old.ring, r)
	}
}

// metaAt is the metadata conf's node gossips, with ip as the host of
// addresses that have none ("" leaves them as configured), and boot, its
// process's.
func metaAt(conf Config, boot, ip string) meta {
	return meta{Peer: withHost(conf.PeerAddr, ip), GRPC: withHost(conf.GRPCAddr, ip), HTTP: withHost(conf.HTTPAddr, ip), Boot: boot}
}

// newBoot returns a new process's boot id (ring.Member.Boot): 8 random
// bytes, in hex.
func newBoot() string {
	var b [8]byte
	crand.Read(b[:]) // never fails
	return hex.EncodeToString(b[:])
}

// alone reports whether no other node is alive, as far as this node knows.
func (c *Cluster) alone() bool {
	for _, m := range c.view.Load().members {
		if m.State == Alive && m.Name != c.conf.NodeName {
			return false
		}
	}
	return true
}

// trackGone keeps the members to reconnect to (see
// Config.ReconnectInterval) up to date with n, at now: one that is alive
// is not, one that went after being in the ring (inRing: admitted, or
// admission is off) is, from when it went until ReconnectTimeout later.
// At most maxGone are kept, the ones that went last.
func (c *Cluster) trackGone(n node, inRing bool, now time.Time) {
	if n.name == c.conf.NodeName {
		return
	}
	if n.alive {
		delete(c.gone, n.name)
		return
	}
	if _, ok := c.gone[n.name]; ok || !inRing || now.Sub(n.change) >= c.conf.ReconnectTimeout {
		return
	}
	if len(c.gone) >= maxGone {
		oldest := ""
		for name, g := range c.gone {
			if oldest == "" || g.since.Before(c.gone[oldest].since) {
				oldest = name
			}
		}
		delete(c.gone, oldest)
	}
	c.gone[n.name] = goneMember{addr: n.addr, since: n.change}
}

// toReconnect returns the gossip addresses of the gone members to try at
// now, at most reconnectBatch, those tried least recently first, and
// forgets those gone for longer than ReconnectTimeout.
func (c *Cluster) toReconnect(now time.Time) []string {
	var names []string
	for name, g := range c.gone {
		if now.Sub(g.since) >= c.conf.ReconnectTimeout {
			delete(c.gone, name)
			continue
		}
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int { return c.gone[a].tried.Compare(c.gone[b].tried) })
	var addrs []string
	for _, name := range names[:min(len(names), reconnectBatch)] {
		g := c.gone[name]
		g.tried = now
		c.gone[name] = g
		addrs = append(addrs, g.addr)
	}
	return addrs
}
