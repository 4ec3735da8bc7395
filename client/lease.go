package client

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// Leases: checks of a Limit with Lease decided in this process, from
// grants the keys' owners lend it (see docs/leases.md).
//
// A Client is one lessee: it picks a 128-bit secret when it is made, and
// every node names its accounts by a hash of it. Each leased key has an
// entry (leased) holding the grant: a check takes its hits from what is
// left of it with one atomic operation, and goes to the owner only when
// there is none (the key's first check), when it is spent while the owner
// last said it had hits to lend, or when it has expired. Every round a
// goroutine of the client's reports each key's running totals to its
// owner, renewing the grant, and gives back what the key did not need.

// DefaultLeaseInterval is how often a client reports its leased keys to
// their owners: the nodes' default --global-sync, for which owners size
// grants.
const DefaultLeaseInterval = 100 * time.Millisecond

// maxLeasedKeys bounds the keys a client leases at once; further keys
// are checked as GLOBAL, without a lease, until leased keys go idle.
const maxLeasedKeys = 10_000

// leaseShards is how many parts the leased keys are split over, so that
// adding one copies a small map.
const leaseShards = 64

// keepRounds is how many rounds of what a key was asked in a round the
// client keeps of its grant at a round's end; it gives back the rest.
const keepRounds = 2

// backoffRounds is how long a key whose owner refused it a lease (a bound
// was full) is checked without one before the client asks again.
const backoffRounds = 10

// flightTries is how many calls to the owner a check that finds its grant
// spent waits for, or makes, before it goes to the node as a GLOBAL check:
// while many checks wait for each call, the grant it brings may be spent
// before this one's turn.
const flightTries = 8

// DecidedByLease is the Decision.DecidedBy of a check decided in this
// process, from a lease.
const DecidedByLease = "lease"

// Leaser takes a lessee's call: a node's RateLimiter/Lease, or, in a test,
// the node's side in process (package lease's Node). A Checker given to
// Wrap that is also a Leaser decides leased limits from leases.
type Leaser interface {
	Lease(ctx context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error)
}

// WithLeaseInterval sets how often the client reports its leased keys
// (DefaultLeaseInterval without it); owners size grants for reports at
// their --global-sync. It must be positive.
func WithLeaseInterval(every time.Duration) Option {
	return func(o *options) { o.leaseEvery = every }
}

// leaseKey names a leased counter.
type leaseKey struct{ name, key string }

// leases is a client's side of the lessee protocol. It is safe for
// concurrent use.
type leases struct {
	secret   []byte
	route    func(key string) Leaser // where the reports of key go
	interval time.Duration
	base     time.Time    // the monotonic clock's origin: expiries are offsets from it
	epochs   atomic.Int64 // the last account epoch begun
	count    atomic.Int64 // entries
	shards   [leaseShards]leaseShard

	ctx     context.Context // ends with Close
	cancel  context.CancelFunc
	start   sync.Once
	running sync.WaitGroup // the round loop
}

// leaseShard is some of the leased keys: a map that is replaced, never
// changed, so that checks read it without a lock.
type leaseShard struct {
	mu sync.Mutex // serializes replacements
	m  atomic.Pointer[map[leaseKey]*leased]
	_  [48]byte // keeps neighbouring shards off one cache line
}

// newLeases returns a client's leases, whose calls go where route says,
// reported every interval. It starts nothing: the first leased check
// starts the round loop.
func newLeases(route func(key string) Leaser, interval time.Duration) *leases {
	secret := make([]byte, 16)
	rand.Read(secret) // never fails (crypto/rand, Go 1.24)
	t := &leases{secret: secret, route: route, interval: interval, base: time.Now()}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	for i := range t.shards {
		t.shards[i].m.Store(&map[leaseKey]*leased{})
	}
	return t
}

// leased is the client's account of one leased key: the grant, read and
// spent by checks without a lock, and the running totals it reports.
type leased struct {
	// The grant, as checks use it. left is what may still be admitted:
	// a check takes its hits from it, then counts them in admitted.
	left     atomic.Int64
	admitted atomic.Int64
	refused  atomic.Int64 // hits asked and refused here, in all
	owned    atomic.Int64 // hits sent to the owner to decide, in all
	active   atomic.Bool  // a check came since the last round
	// From the owner's last answer: when the grant expires (offset from
	// leases.base; the client stops using it then), what the owner would
	// lend this client now, when the counter is full again (Unix ns), and
	// the wait it estimates for one hit.
	expires    atomic.Int64
	unlent     atomic.Int64
	resetAt    atomic.Int64
	retryAfter atomic.Int64

	limit Limit         // the limit the key is leased under
	item  *pb.CheckItem // the report's item; never changed

	mu        sync.Mutex // the account, below
	epoch     int64
	granted   int64 // as the owner last answered, less what was given back since
	acked     int64
	asked     int64 // at the last round's end
	release   bool  // a give-back not yet acknowledged
	sent      uint64
	applied   uint64        // the newest call whose answer was applied
	flight    chan struct{} // closed when the call to the owner in flight returns; nil if none
	idle      int           // rounds without a check or anything to report
	backoff   int           // rounds left without a lease
	forgotten bool          // removed from its shard: a check that still holds e looks its key up again
}

// same reports whether l is the limit e is leased under.
func (e *leased) same(l *Limit) bool {
	return l.Count == e.limit.Count && l.Period == e.limit.Period && l.Burst == e.limit.Burst && l.Algorithm == e.limit.Algorithm
}

// now is the time since t.base, by the monotonic clock.
func (t *leases) now() int64 { return int64(time.Since(t.base)) }

func (t *leases) shard(key string) *leaseShard {
	return &t.shards[xxhash.Sum64String(key)%leaseShards]
}

// checkLeased refuses a Limit that cannot be leased: one with a
// MinInterval or a Ceiling, or a Behavior other than Global (or the zero
// Batched): a leased counter is the key's GLOBAL counter.
func checkLeased(l *Limit) error {
	switch {
	case l.MinInterval != 0:
		return fmt.Errorf("%w: Lease: not with a MinInterval (as not with Global)", ErrInvalid)
	case l.Ceiling != 0 || l.Parent != (Parent{}):
		return fmt.Errorf("%w: Lease: not with a Ceiling or Parent (as not with Global)", ErrInvalid)
	case l.Behavior != Batched && l.Behavior != Global:
		return fmt.Errorf("%w: Lease: with Behavior Global (or none), not %v", ErrInvalid, l.Behavior)
	}
	return nil
}

// take decides a check of l's key from its lease, and reports whether it
// did; when it did not (no lease could be had), the caller checks it as a
// GLOBAL check. An error is the owner's refusal of the check as invalid.
func (t *leases) take(ctx context.Context, l *Limit, key string, hits int64) (Decision, bool, error) {
	e := (*t.shard(key).m.Load())[leaseKey{l.Name, key}]
	if e != nil && e.same(l) {
		if d, ok := e.fromGrant(t, l, hits); ok {
			return d, true, nil
		}
	}
	return t.slow(ctx, l, key, hits)
}

// fromGrant decides a check from e's grant, if it can without the owner:
// the grant has not expired and has the hits left, or it is spent while
// the owner last said it has nothing left to lend (refused here).
func (e *leased) fromGrant(t *leases, l *Limit, hits int64) (Decision, bool) {
	if !e.active.Load() {
		e.active.Store(true)
	}
	d := Decision{Limit: l.Count, DecidedBy: DecidedByLease, ResetAt: time.Unix(0, e.resetAt.Load())}
	capacity := l.Count
	if l.Burst > 0 {
		capacity = l.Burst
	}
	if hits > capacity {
		e.refused.Add(hits)
		d.RetryAfter, d.Remaining = Never, max(0, e.left.Load())+e.unlent.Load()
		return d, true
	}
	if t.now() >= e.expires.Load() {
		return d, false
	}
	for {
		left := e.left.Load()
		if left < hits {
			break
		}
		if e.left.CompareAndSwap(left, left-hits) {
			e.admitted.Add(hits)
			d.Allowed, d.Remaining = true, left-hits+e.unlent.Load()
			return d, true
		}
	}
	if e.unlent.Load() > 0 {
		return d, false // the owner has hits to lend: it decides
	}
	e.refused.Add(hits)
	d.Remaining = max(0, e.left.Load())
	d.RetryAfter = ceilDuration(max(time.Duration(e.retryAfter.Load()), t.interval))
	return d, true
}

// ceilDuration rounds d up to the millisecond, as every Decision's
// durations are.
func ceilDuration(d time.Duration) time.Duration {
	return time.Duration(ceilMillis(d)) * time.Millisecond
}

// slow decides a check that its grant cannot: at the owner, in a call of
// its own that brings a grant back, which concurrent checks of the key
// wait for and then use. It reports false when the key cannot be leased
// (the client leases as many keys as it may, the owner refused a lease,
// or the call failed).
func (t *leases) slow(ctx context.Context, l *Limit, key string, hits int64) (Decision, bool, error) {
	t.start.Do(func() { t.running.Go(t.run) })
	for try := range flightTries {
		e := t.entry(l, key)
		if e == nil {
			return Decision{}, false, nil
		}
		e.mu.Lock()
		switch {
		case e.forgotten: // a round forgot it meanwhile: look again
			e.mu.Unlock()
			continue
		case e.backoff > 0:
			e.mu.Unlock()
			return Decision{}, false, nil
		case e.flight != nil: // another check is asking the owner: use what it brings
			wait := e.flight
			e.mu.Unlock()
			select {
			case <-wait:
			case <-ctx.Done():
				return Decision{}, true, ctx.Err()
			}
			if d, ok := e.fromGrant(t, l, hits); ok {
				return d, true, nil
			}
			continue
		}
		if try > 0 {
			if d, ok := e.fromGrant(t, l, hits); ok { // a call returned since this check last looked
				e.mu.Unlock()
				return d, true, nil
			}
		}
		e.flight = make(chan struct{})
		e.owned.Add(hits)
		rep, seq := e.report(hits), e.nextCall()
		e.mu.Unlock()
		d, ok, err := t.ask(ctx, e, rep, seq)
		e.mu.Lock()
		close(e.flight)
		e.flight = nil
		e.mu.Unlock()
		return d, ok, err
	}
	return Decision{}, false, nil // still spent after as many calls: the node decides it, as a GLOBAL check
}

// ask sends rep, call seq of e, alone to its key's owner and decides its
// hits by the owner's answer.
func (t *leases) ask(ctx context.Context, e *leased, rep *pb.LeaseReport, seq uint64) (Decision, bool, error) {
	sent := t.now()
	resp, err := t.route(e.item.GetKey()).Lease(ctx, &pb.LeaseRequest{Lessee: t.secret, Reports: []*pb.LeaseReport{rep}})
	if err != nil || len(resp.GetGrants()) != 1 {
		return Decision{}, false, nil // the key is checked as GLOBAL: the node decides, as it decides any
	}
	g := resp.GetGrants()[0]
	e.mu.Lock()
	taken := t.apply(e, g, seq, sent)
	e.mu.Unlock()
	if g.GetErrorCode() == pb.ErrorCode_INVALID_ARGUMENT {
		return Decision{}, true, fmt.Errorf("%w: %s", ErrInvalid, g.GetError())
	}
	if !taken || g.GetDecided() == nil {
		return Decision{}, false, nil
	}
	d, err := DecisionOf(g.GetDecided())
	return d, true, err
}

// entry returns key's entry under l, adding it unless the client leases
// as many keys as it may; nil if it cannot, or key is leased under
// another limit (until that lease goes idle).
func (t *leases) entry(l *Limit, key string) *leased {
	sh := t.shard(key)
	k := leaseKey{l.Name, key}
	if e := (*sh.m.Load())[k]; e != nil {
		if !e.same(l) {
			return nil
		}
		return e
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	old := *sh.m.Load()
	if e := old[k]; e != nil {
		if !e.same(l) {
			return nil
		}
		return e
	}
	if t.count.Load() >= maxLeasedKeys {
		return nil
	}
	item := l.Item(key, 0)
	item.Hits, item.Behavior = nil, Global
	e := &leased{limit: *l, item: item, epoch: t.epochs.Add(1 << 20)}
	m := make(map[leaseKey]*leased, len(old)+1)
	for k2, e2 := range old {
		m[k2] = e2
	}
	m[k] = e
	sh.m.Store(&m)
	t.count.Add(1)
	return e
}

// forget removes the entries of sh for which gone reports true.
func (sh *leaseShard) forget(t *leases, gone func(*leased) bool) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	old := *sh.m.Load()
	m := make(map[leaseKey]*leased, len(old))
	for k, e := range old {
		if gone(e) {
			e.forgotten = true
			t.count.Add(-1)
			continue
		}
		m[k] = e
	}
	if len(m) < len(old) {
		sh.m.Store(&m)
	}
}

// nextCall numbers a call of e. e.mu is held.
func (e *leased) nextCall() uint64 {
	e.sent++
	return e.sent
}

// report is e's account, asking the owner to decide hits (counted in
// e.owned already). e.mu is held.
func (e *leased) report(hits int64) *pb.LeaseReport {
	admitted := e.admitted.Load()
	return &pb.LeaseReport{Item: e.item, Epoch: e.epoch, Admitted: admitted, Acked: min(e.acked, admitted),
		Asked: admitted + e.refused.Load() + e.owned.Load(), Granted: e.granted, Release: e.release, Hits: hits}
}

// apply takes the owner's answer g to call seq of e, sent at sent (by
// t.now), if it is the newest applied and of e's epoch, and reports
// whether the owner took the report. An answer refusing a lease for a
// bound sets e's backoff. e.mu is held.
func (t *leases) apply(e *leased, g *pb.LeaseGrant, seq uint64, sent int64) bool {
	if g.GetError() != "" {
		if g.GetErrorCode() == pb.ErrorCode_UNAVAILABLE && e.granted == 0 {
			e.backoff = backoffRounds // no grant yet, and the owner would not lend (a bound, or no owner): check as GLOBAL a while
		}
		return false
	}
	if seq <= e.applied || g.GetEpoch() != e.epoch {
		return true // an answer to an older call, or to the account before a give-back
	}
	e.applied = seq
	e.acked = max(e.acked, g.GetAcked())
	e.release = false
	e.left.Add(g.GetGranted() - e.granted)
	e.granted = g.GetGranted()
	ttl := time.Duration(g.GetTtlMs()) * time.Millisecond
	e.expires.Store(sent + int64(ttl*3/4))
	st := g.GetState()
	e.unlent.Store(st.GetRemaining())
	e.resetAt.Store(time.UnixMilli(st.GetResetTimeMs()).UnixNano())
	e.retryAfter.Store(int64(time.Duration(st.GetRetryAfterMs()) * time.Millisecond))
	return true
}

// run reports every leased key each round until the client closes.
func (t *leases) run() {
	tick := time.NewTicker(t.interval)
	defer tick.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tick.C:
			t.round(t.ctx, false)
		}
	}
}

// outgoing is one call of a round: the reports bound for one node.
type outgoing struct {
	to      Leaser
	entries []*leased
	seqs    []uint64
	reports []*pb.LeaseReport
	bytes   int
}

// round ends every entry's round (giving back what it did not need, or,
// with all, everything), reports each that has anything to say to its
// key's owner, and applies the answers; it forgets entries idle for two
// rounds with nothing held or to report.
func (t *leases) round(ctx context.Context, all bool) {
	var calls []*outgoing
	byDest := map[Leaser][]*outgoing{}
	for i := range t.shards {
		sh := &t.shards[i]
		for _, e := range *sh.m.Load() {
			e.mu.Lock()
			send := e.endRound(all)
			var rep *pb.LeaseReport
			var seq uint64
			if send {
				rep, seq = e.report(0), e.nextCall()
			}
			e.mu.Unlock()
			if !send {
				continue
			}
			to := t.route(e.item.GetKey())
			o := last(byDest[to])
			if o == nil || len(o.reports) == maxBatchItems || o.bytes+itemBytes(e.item) > maxBatchBytes {
				o = &outgoing{to: to}
				byDest[to] = append(byDest[to], o)
				calls = append(calls, o)
			}
			o.entries, o.seqs, o.reports = append(o.entries, e), append(o.seqs, seq), append(o.reports, rep)
			o.bytes += itemBytes(e.item)
		}
		sh.forget(t, func(e *leased) bool {
			e.mu.Lock()
			defer e.mu.Unlock()
			return e.idle >= 2
		})
	}
	var wg sync.WaitGroup
	for _, o := range calls {
		wg.Go(func() { t.send(ctx, o) })
	}
	wg.Wait()
}

// last returns the last of os, or nil.
func last(os []*outgoing) *outgoing {
	if len(os) == 0 {
		return nil
	}
	return os[len(os)-1]
}

// send makes call o and applies its answers.
func (t *leases) send(ctx context.Context, o *outgoing) {
	ctx, cancel := context.WithTimeout(ctx, max(t.interval, time.Second))
	defer cancel()
	sent := t.now()
	resp, err := o.to.Lease(ctx, &pb.LeaseRequest{Lessee: t.secret, Reports: o.reports})
	if err != nil || len(resp.GetGrants()) != len(o.reports) {
		return // sent again, as running totals, next round
	}
	for i, g := range resp.GetGrants() {
		e := o.entries[i]
		e.mu.Lock()
		t.apply(e, g, o.seqs[i], sent)
		e.mu.Unlock()
	}
}

// endRound ends e's round: it gives back what e holds beyond keepRounds of
// what it was asked in the round (all, with all, or after a round without
// a check), and reports whether e has anything to tell its owner. e.mu is
// held.
func (e *leased) endRound(all bool) bool {
	active := e.active.Swap(false)
	asked := e.admitted.Load() + e.refused.Load() + e.owned.Load()
	round := asked - e.asked
	e.asked = asked
	if e.backoff > 0 {
		e.backoff--
	}
	keep := keepRounds * round
	if all || !active {
		keep = 0
	}
	if !e.release && e.granted > 0 {
		for {
			left := e.left.Load()
			if left <= keep {
				break
			}
			if e.left.CompareAndSwap(left, keep) {
				e.granted -= left - keep
				e.epoch++
				e.release = true
				break
			}
		}
	}
	send := active || e.release || e.admitted.Load() != e.acked || e.left.Load() > 0
	if send || e.flight != nil {
		e.idle = 0
	} else {
		e.idle++
	}
	return send && e.backoff == 0
}

// close gives every grant back, in one last round bounded by timeout, and
// stops the round loop.
func (t *leases) close(timeout time.Duration) {
	t.cancel()
	t.running.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	t.round(ctx, true)
}
