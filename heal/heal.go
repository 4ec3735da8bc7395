// Package heal watches which owners answer: it sends every request this
// node has another member decide (Start, Send), suspects an owner whose
// send failed, so that its keys fail over at once, probes the suspects
// until they answer, and gives back what this node decided for an owner
// that did not once it does.
package heal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/ring"
)

// Peers is what a Node needs of the other nodes: package peer's Pool. A
// probe is an empty check, which decides nothing, sent with ForwardNow.
type Peers interface {
	Start(ctx context.Context, addr string, req *pb.CheckRequest) peer.Forwarding
	ForwardNow(ctx context.Context, addr string, req *pb.CheckRequest) (*pb.CheckResponse, error)
	Relay(ctx context.Context, addr string, req *pb.CheckRequest) (*pb.CheckResponse, error)
	Pull(ctx context.Context, addr string, req *pb.CheckRequest) (*pb.CheckResponse, error)
}

// Membership is what a Node needs of the cluster: the ring, whose members
// it probes, forgetting the others.
type Membership interface{ Ring() *ring.Ring }

// Config configures a Node. Peers and Cluster are required.
type Config struct {
	Peers   Peers
	Cluster Membership
	// Logger receives the warnings of owners that cannot be reached; nil
	// discards them.
	Logger *slog.Logger
	// Registerer receives ringlimit_suspect_owners; nil registers none.
	Registerer prometheus.Registerer
}

// Node is one node's view of which owners answer: the suspects, whose
// keys fail over, and the owners it stood in for, which get their
// counters back once they answer. It is safe for concurrent use; Run
// probes.
type Node struct {
	peers    Peers
	cluster  Membership
	gaveBack chan struct{} // cap 1: coalesces the give-backs not acted on yet
	suspects suspects
	standIns standIns
	log      *slog.Logger
	logged   sampler // thins out Unreachable's warnings
}

// New returns a Node. It starts nothing.
func New(conf Config) *Node {
	n := &Node{peers: conf.Peers, cluster: conf.Cluster, gaveBack: make(chan struct{}, 1), log: conf.Logger}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	if reg := conf.Registerer; reg != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ringlimit_suspect_owners",
			Help: "Owners this node suspects after a forward to them timed out or found them unreachable: their keys fail over (to their heir, or the next member this node reaches) until a probe answers.",
		}, func() float64 { return float64(n.suspects.count()) }))
	}
	return n
}

// Suspect reports whether this node suspects the owner at addr now.
func (n *Node) Suspect(addr string) bool { return n.suspects.suspect(addr) }

// Mark makes the owner at addr suspect from now for SuspectFor, after a
// forward to it failed (see Failed); the forwards in flight to it are
// released (see Watch).
func (n *Node) Mark(addr string) { n.suspects.mark(addr) }

// Watch returns a context canceled once the owner at addr becomes
// suspect: a forward in flight to it waits on it, and gives up as soon as
// another forward finds the owner unreachable. Take it before asking
// Suspect, so that no suspicion falls between the two.
func (n *Node) Watch(addr string) context.Context { return n.suspects.watch(addr) }

// GaveBack signals once an owner this node stood in for answers again:
// every counter held here for a key this node does not own is then to go
// to the key's owner (a round of hand-off, which package custody runs).
func (n *Node) GaveBack() <-chan struct{} { return n.gaveBack }

// StandIn records that this node decided, at, a check of the owner at
// addr by failover: the owner gets the counter back once it answers, and
// no such decision has come for StandInQuiet (see GiveBack). at is
// time.Now() but in tests: suspicions and stand-ins are timed by the real
// clock.
func (n *Node) StandIn(addr string, at time.Time) { n.standIns.note(addr, at) }

// members returns the peer addresses of the ring's members.
func (n *Node) members() map[string]bool {
	members := make(map[string]bool)
	for _, m := range n.cluster.Ring().Members() {
		members[m.PeerAddr] = true
	}
	return members
}

// A frozen owner (a GC pause, a VM stall, SIGSTOP) keeps its TCP
// connections open, so every forward to it waits the whole forward
// deadline, for as long as memberlist takes to declare it dead (about 5s).
// Suspicion cuts that to one deadline: once a forward to an owner has
// timed out or found it unreachable, checks for its keys fail over at once
// (to the first member of each key's succession this node does not
// suspect: see package service's failOver), until a probe finds it answering again.
const (
	// SuspectFor is how long a suspicion lasts unless confirmed again. A
	// failed probe confirms it; so a node that does not Run, which sends
	// no probes, tries the owner again this long after the last failure.
	SuspectFor = time.Second
	// ProbeEvery is the pause between two rounds of probes.
	ProbeEvery = 100 * time.Millisecond
	// ProbeTimeout bounds a probe: an empty check, which a live owner
	// answers in well under a millisecond.
	ProbeTimeout = 250 * time.Millisecond
)

// ErrSuspect is the error of a forward not sent because its owner is
// suspect.
var ErrSuspect = fmt.Errorf("owner suspect after a failed forward, not tried until a probe answers: %w", peer.ErrUnreachable)

// suspects are the peer addresses of owners whose last forward or probe
// failed, each with the time its suspicion lapses. It is safe for
// concurrent use.
//
// A suspicion is a timer: it lapses SuspectFor after a failure of this
// node's own forwards, which fail on the real clock (their deadlines are
// contexts' timers), as the probes run on timers. So suspicions are timed
// by the real clock (see now), not by the clock checks are decided at: that is the clock checks
// are decided at, which tests fix and a check's created_at_ms may move,
// and a suspicion timed by a fixed clock would never lapse.
type suspects struct {
	// held is len(until), so that a forward, which asks on every call,
	// takes no lock while no owner is suspect: the normal case.
	held  atomic.Int64
	mu    sync.Mutex
	until map[string]time.Time
	// watches holds, by address, a context canceled when the address
	// becomes suspect: forwards in flight to it then stop waiting too.
	watches sync.Map // string -> context.Context with its cancel, a watch
}

// watch is the context of one address's forwards until it is suspected.
type watch struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// watch returns the context that is canceled when addr becomes suspect.
func (s *suspects) watch(addr string) context.Context {
	if w, ok := s.watches.Load(addr); ok {
		return w.(*watch).ctx
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, loaded := s.watches.LoadOrStore(addr, &watch{ctx, cancel})
	if loaded {
		cancel()
	}
	return w.(*watch).ctx
}

// forget drops the watches and the suspicions of addresses that are not
// in members, such as nodes that left the cluster or were declared dead:
// a suspicion is of an owner, and ringlimit_suspect_owners counted a
// member the ring had dropped until its suspicion lapsed, up to
// SuspectFor after the ring change (so a cluster that had converged
// looked as if it had not: the chaos suite's kill -9 waits for none).
func (s *suspects) forget(members map[string]bool) {
	s.watches.Range(func(addr, _ any) bool {
		if !members[addr.(string)] {
			s.watches.Delete(addr)
		}
		return true
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	for addr := range s.until {
		if !members[addr] {
			delete(s.until, addr)
		}
	}
	s.held.Store(int64(len(s.until)))
}

// now is the time suspicions are timed by: the real clock (see suspects).
func (*suspects) now() time.Time { return time.Now() }

// suspect reports whether addr is suspect now.
func (s *suspects) suspect(addr string) bool {
	if s.held.Load() == 0 {
		return false
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	return now.Before(s.until[addr])
}

// mark makes addr suspect from now for SuspectFor. If it was not, the
// forwards in flight to it are released (see watch).
func (s *suspects) mark(addr string) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.until == nil {
		s.until = make(map[string]time.Time)
	}
	newly := !now.Before(s.until[addr])
	s.until[addr] = now.Add(SuspectFor)
	s.held.Store(int64(len(s.until)))
	if w, ok := s.watches.Load(addr); ok && newly {
		s.watches.Delete(addr)
		w.(*watch).cancel()
	}
}

// clear ends addr's suspicion.
func (s *suspects) clear(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.until, addr)
	s.held.Store(int64(len(s.until)))
}

// count returns how many addresses are suspect now.
func (s *suspects) count() int {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, until := range s.until {
		if now.Before(until) {
			n++
		}
	}
	return n
}

// list returns the addresses suspect now, and forgets the lapsed ones,
// so that the map holds only owners that failed in the last SuspectFor.
func (s *suspects) list() []string {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var addrs []string
	for addr, until := range s.until {
		if !now.Before(until) {
			delete(s.until, addr)
			continue
		}
		addrs = append(addrs, addr)
	}
	s.held.Store(int64(len(s.until)))
	return addrs
}

// Failed reports whether err, from a forward made with ctx, means the
// owner did not answer in time or could not be reached: only that makes
// it suspect. A slow answer, a refusal, or the caller leaving does not.
func Failed(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	return errors.Is(err, peer.ErrUnreachable) || errors.Is(err, context.DeadlineExceeded)
}

// Run runs rounds of probes of the suspect owners until ctx ends: an
// empty check, which decides nothing. An answer ends the suspicion, so
// forwarding resumes; a failure confirms it. An owner that left the ring
// is no longer probed, and its suspicion lapses. Each round also gives
// back what this node decided by failover to the owners that answer
// again (see GiveBack). It returns when ctx ends.
func (n *Node) Run(ctx context.Context) {
	t := time.NewTimer(ProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		members := n.members()
		n.suspects.forget(members)
		var wg sync.WaitGroup
		for _, addr := range n.suspects.list() {
			if !members[addr] {
				continue
			}
			wg.Go(func() {
				pctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
				defer cancel()
				_, err := n.peers.ForwardNow(pctx, addr, &pb.CheckRequest{})
				switch {
				case err == nil:
					n.suspects.clear(addr)
				case Failed(ctx, err):
					n.suspects.mark(addr)
					n.resetPeer(addr)
				}
			})
		}
		wg.Wait()
		n.giveBack(ctx, members)
		t.Reset(ProbeEvery)
	}
}

// After a heal. A member that decides an unreachable owner's keys by
// failover does so on a counter of its own, which nothing took back to
// the owner but the next ring change. So a stand-in remembers the owners
// it decided for (standIns), and once such an owner answers again and no
// check has come for it by failover for StandInQuiet, it runs a round of
// hand-off, which gives the owner those counters; their stand-in hits are
// added to the owner's counter (limiter.Store.Merge), so that it counts
// what both sides of a partition admitted. See docs/design-cluster.md,
// "After a heal: stand-ins give back".

// StandInQuiet is how long after its last failover decision for an owner
// a stand-in waits before it gives that owner's counters back: other
// nodes may still relay the owner's keys here until their own suspicion
// ends (a probe every ProbeEvery; their connections come back within
// about two seconds of the owner answering again, see package peer), and
// each such check would take the counter back from the replica again.
const StandInQuiet = time.Second

// standIns are the owners (by peer address) whose keys this node decided
// by failover, each with the time of the last such decision, timed by the
// real clock as suspicions are. It is safe for concurrent use.
type standIns struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// note records a failover decision for the owner at addr now.
func (st *standIns) note(addr string, now time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.last == nil {
		st.last = make(map[string]time.Time)
	}
	st.last[addr] = now
}

// quiet returns the owners for which no failover decision came for
// StandInQuiet before now.
func (st *standIns) quiet(now time.Time) []string {
	st.mu.Lock()
	defer st.mu.Unlock()
	var addrs []string
	for addr, last := range st.last {
		if now.Sub(last) >= StandInQuiet {
			addrs = append(addrs, addr)
		}
	}
	return addrs
}

// done forgets addr, unless a failover decision for it came after since.
func (st *standIns) done(addr string, since time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if last, ok := st.last[addr]; ok && !last.After(since) {
		delete(st.last, addr)
	}
}

// forget drops the owners that are not in members (they left the ring:
// the next ring change hands their keys' counters to the new owners).
func (st *standIns) forget(members map[string]bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for addr := range st.last {
		if !members[addr] {
			delete(st.last, addr)
		}
	}
}

// GiveBack is one round of the stand-in's part of a heal (Run runs one
// after each round of probes): it probes each owner it decided for, and
// quiet for StandInQuiet; an owner that answers gets back the counters of
// its keys held here (see GaveBack), and one that does not is suspect.
func (n *Node) GiveBack(ctx context.Context) { n.giveBack(ctx, n.members()) }

// giveBack is GiveBack, of the owners whose peer addresses are in members.
func (n *Node) giveBack(ctx context.Context, members map[string]bool) {
	n.standIns.forget(members)
	start := n.suspects.now()
	handBack := false
	for _, addr := range n.standIns.quiet(start) {
		pctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
		_, err := n.peers.ForwardNow(pctx, addr, &pb.CheckRequest{})
		cancel()
		switch {
		case err == nil:
			n.standIns.done(addr, start)
			handBack = true
		case Failed(ctx, err):
			n.suspects.mark(addr)
			n.resetPeer(addr)
		}
	}
	if handBack {
		select { // no ring change: a round that finds these counters not this node's
		case n.gaveBack <- struct{}{}:
		default:
		}
	}
}

// resetter is what Peers may also do: close a connection that gRPC holds
// ready but on which a call timed out (peer.Pool.Reset).
type resetter interface{ Reset(addr string) bool }

// reviver is what RingChanged asks of the peers, if they can: to try a
// failing connection again at once (peer.Pool.Revive).
type reviver interface{ Revive(addr string) bool }

// RingChanged ends the suspicions of the members the new ring dropped
// (see forget), and has the connections to its members that are
// failing try again at once: a member gossip has just brought back
// (after a partition, or a restart) answers within moments, while its
// connection would wait out its backoff, and this node's suspicion of it
// would last until a probe went through it. The next probe, within
// ProbeEvery, then finds it.
func (n *Node) RingChanged() {
	members := n.members()
	n.suspects.forget(members)
	rv, ok := n.peers.(reviver)
	if !ok {
		return
	}
	for addr := range members {
		rv.Revive(addr)
	}
}

// resetPeer resets the connection to the owner at addr, whose probe has
// just failed, if the peers can: a connection left established across a
// network cut may stay stuck for many seconds after the cut heals, while
// a new one would answer at once (see peer.Pool.Reset). The next probe
// dials afresh.
func (n *Node) resetPeer(addr string) {
	if r, ok := n.peers.(resetter); ok {
		r.Reset(addr)
	}
}
