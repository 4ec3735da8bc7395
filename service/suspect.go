package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/peer"
)

// A frozen owner (a GC pause, a VM stall, SIGSTOP) keeps its TCP
// connections open, so every forward to it waits the whole forward
// deadline, for as long as memberlist takes to declare it dead (about 5s).
// Suspicion cuts that to one deadline: once a forward to an owner has
// timed out or found it unreachable, checks for its keys fail over at once
// (to the first member of each key's succession this node does not
// suspect, see failOver), until a probe finds it answering again.
const (
	// suspectFor is how long a suspicion lasts unless confirmed again. A
	// failed probe confirms it; so a service without Run, which sends no
	// probes, tries the owner again this long after the last failure.
	suspectFor = time.Second
	// probeEvery is the pause between two rounds of probes.
	probeEvery = 100 * time.Millisecond
	// probeTimeout bounds a probe: an empty check, which a live owner
	// answers in well under a millisecond.
	probeTimeout = 250 * time.Millisecond
)

// errSuspect is the error of a forward not sent because its owner is
// suspect.
var errSuspect = fmt.Errorf("owner suspect after a failed forward, not tried until a probe answers: %w", peer.ErrUnreachable)

// suspects are the peer addresses of owners whose last forward or probe
// failed, each with the time its suspicion lapses. It is safe for
// concurrent use.
//
// A suspicion is a timer: it lapses suspectFor after a failure of this
// node's own forwards, which fail on the real clock (their deadlines are
// contexts' timers), as the probes run on timers. So suspicions are timed
// by the real clock (see now), not by Config.Now: that is the clock checks
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

// forget drops the watches of addresses that are not in members, such as
// nodes that left the cluster.
func (s *suspects) forget(members map[string]bool) {
	s.watches.Range(func(addr, _ any) bool {
		if !members[addr.(string)] {
			s.watches.Delete(addr)
		}
		return true
	})
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

// mark makes addr suspect from now for suspectFor. If it was not, the
// forwards in flight to it are released (see watch).
func (s *suspects) mark(addr string) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.until == nil {
		s.until = make(map[string]time.Time)
	}
	newly := !now.Before(s.until[addr])
	s.until[addr] = now.Add(suspectFor)
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
// so that the map holds only owners that failed in the last suspectFor.
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

// registerSuspects exports the number of suspect owners to reg, read at
// each scrape: a non-zero value means checks for some keys fail over,
// decided without their owner.
func (s *Service) registerSuspects(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ringlimit_suspect_owners",
		Help: "Owners this node suspects after a forward to them timed out or found them unreachable: their keys fail over (to their heir, or the next member this node reaches) until a probe answers.",
	}, func() float64 { return float64(s.suspects.count()) }))
}

// failed reports whether err, from a forward made with ctx, means the
// owner did not answer in time or could not be reached: only that makes
// it suspect. A slow answer, a refusal, or the caller leaving does not.
func failed(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	return errors.Is(err, peer.ErrUnreachable) || errors.Is(err, context.DeadlineExceeded)
}

// probe runs rounds of probes of the suspect owners until ctx ends: an
// empty check, which decides nothing. An answer ends the suspicion, so
// forwarding resumes; a failure confirms it. An owner that left the ring
// is no longer probed, and its suspicion lapses. Each round also gives
// back what this node decided by failover to the owners that answer
// again (see giveBack).
func (s *Service) probe(ctx context.Context) {
	t := time.NewTimer(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		members := make(map[string]bool)
		for _, m := range s.cluster.Ring().Members() {
			members[m.PeerAddr] = true
		}
		s.suspects.forget(members)
		var wg sync.WaitGroup
		for _, addr := range s.suspects.list() {
			if !members[addr] {
				continue
			}
			wg.Go(func() {
				pctx, cancel := context.WithTimeout(ctx, probeTimeout)
				defer cancel()
				_, err := s.peers.ForwardNow(pctx, addr, &pb.CheckRequest{})
				switch {
				case err == nil:
					s.suspects.clear(addr)
				case failed(ctx, err):
					s.suspects.mark(addr)
					s.resetPeer(addr)
				}
			})
		}
		wg.Wait()
		s.giveBack(ctx, members)
		t.Reset(probeEvery)
	}
}
