package global

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
)

// The side of a node that lends grants to lessees: processes outside the
// cluster (a Go client, an Envoy stream) that decide checks themselves
// from a grant. A lessee's account sits in the counter's lease beside the
// nodes', reserved alike, but the owner answers each report at once,
// lending a share of what is not lent out by the lessee's demand (topUp);
// a grant lives for a time-to-live; a lessee may claim a grant its
// account does not show (claim); and the accounts are bounded
// (LeaseConfig), since anyone who reaches the public port can open one.
// See docs/leases.md, "How the owner lends".

// Lessee names a lessee's accounts: the first 16 bytes of SHA-256 of the
// lessee's secret (LesseeOf). Nodes keep, relay and broadcast only this
// id, never the secret, so that only the lessee can act on its accounts.
type Lessee [16]byte

// LesseeOf returns the account id of the lessee whose secret is secret.
func LesseeOf(secret []byte) Lessee {
	sum := sha256.Sum256(secret)
	return Lessee(sum[:16])
}

// The defaults of LeaseConfig.
const (
	DefaultLeaseTTL         = 2 * time.Second
	DefaultMaxLessees       = 10_000
	DefaultMaxLeasesPerKey  = 1_000
	DefaultMaxKeysPerLessee = 1_000
)

// maxLeaseAccounts bounds the lessee accounts a node holds, whatever its
// LeaseConfig (about AccountBytes each).
const maxLeaseAccounts = 200_000

// AccountBytes is what a lessee's account of a key holds in memory, as
// LeaseConfig.MaxAccounts is counted from a share of the memory limit.
const AccountBytes = 256

// MaxLeaseTotal bounds a report's running totals: far above what any
// lessee admits in its life, and far enough below the largest int64 that
// no sum of a total and a grant overflows.
const MaxLeaseTotal = 1_000_000_000_000_000_000

// leaseRounds is how many sync intervals of a lessee's demand its grant
// is topped up to cover: a lessee reports every interval, so a grant of
// two lasts until the next top-up with a round to spare.
const leaseRounds = 2

// LeaseConfig bounds a node's lessee accounts, as owner. The zero value of
// each field means its default.
type LeaseConfig struct {
	// TTL is how long a grant lives without a report (--lease-ttl).
	TTL time.Duration
	// MaxLessees bounds the lessees holding accounts on this node
	// (--max-lessees); MaxLeasesPerKey the accounts of one key
	// (--max-leases-per-key); MaxKeysPerLessee one lessee's accounts
	// (--max-keys-per-lessee).
	MaxLessees, MaxLeasesPerKey, MaxKeysPerLessee int
	// MaxAccounts bounds the accounts this node holds as owner, all
	// lessees together (a share of --memory-limit: AccountBytes each);
	// zero, or more than maxLeaseAccounts, means maxLeaseAccounts. An
	// account beyond it is refused (ringlimit_lease_refused_total{reason="total"}).
	MaxAccounts int
}

func (c LeaseConfig) withDefaults() LeaseConfig {
	if c.TTL <= 0 {
		c.TTL = DefaultLeaseTTL
	}
	if c.MaxLessees <= 0 {
		c.MaxLessees = DefaultMaxLessees
	}
	if c.MaxLeasesPerKey <= 0 {
		c.MaxLeasesPerKey = DefaultMaxLeasesPerKey
	}
	if c.MaxKeysPerLessee <= 0 {
		c.MaxKeysPerLessee = DefaultMaxKeysPerLessee
	}
	if c.MaxAccounts <= 0 || c.MaxAccounts > maxLeaseAccounts {
		c.MaxAccounts = maxLeaseAccounts
	}
	return c
}

// Errors of a LeaseGrant: why a report was not taken.
var (
	// ErrInvalidReport is wrapped by the error of a report whose totals
	// are impossible; the error names the field.
	ErrInvalidReport = errors.New("invalid lease report")
	// ErrNotOwner: this node does not own the report's key in its ring.
	ErrNotOwner = errors.New("not the key's owner")
	// ErrLeaseBound: a new account would pass a bound of LeaseConfig.
	ErrLeaseBound = errors.New("lease bound reached")
)

// LeaseReport is a lessee's account of one counter, with the running
// totals of the lessee protocol (ringlimit.v1.LeaseReport).
type LeaseReport struct {
	// Request names the counter and its limit, evaluated at Request.Now,
	// as Config.Validate makes it. Request.Hits, when positive, are hits
	// the owner decides now, exactly, as a GLOBAL check of its own.
	Request limiter.Request
	// Epoch is the account's version. Admitted, Acked and Asked are
	// running totals: hits the lessee admitted from grants, how many of
	// them the owner acknowledged, and hits it was asked for, admitted or
	// not (its demand). Granted is the grant it holds in all, as the
	// owner last answered, or, with Release, what it keeps: it gives back
	// the rest, and the account's epoch becomes Epoch.
	Epoch, Admitted, Acked, Asked, Granted int64
	Release                                bool
	// Interval is how often the lessee reports, when longer than the
	// sync interval (an Envoy stream reports every reporting_interval);
	// zero means every sync interval. Its grant is topped up to cover
	// leaseRounds of the longer of the two, at most half the TTL, so that
	// a lessee that reports seldom is not held to a sync round's demand.
	Interval time.Duration
	// Share asks for a rate share rather than a grant of hits (an Envoy
	// stream: see shares.go); ShareRateMilli and ShareBurst are the share
	// the lessee holds, as the owner last answered it.
	Share                      bool
	ShareRateMilli, ShareBurst int64
}

// LeaseGrant is the owner's answer to one LeaseReport: the account as it
// holds it, and the counter's state.
type LeaseGrant struct {
	// Err, when not nil, says why the report was not taken (it wraps
	// ErrInvalidReport, ErrNotOwner or ErrLeaseBound), and the other
	// fields are zero.
	Err error
	// Epoch, Granted and Acked are the account's: the lessee may admit
	// Granted, counted as its Admitted is, under Epoch; the owner has
	// taken Acked of its admitted hits.
	Epoch, Granted, Acked int64
	// TTL is how long the owner keeps the grant without another report.
	TTL time.Duration
	// Remaining is the counter's hits not lent out; ResetAfter how long
	// until it is full again; RetryAfter the wait for one hit.
	Remaining              int64
	ResetAfter, RetryAfter time.Duration
	// Decided says the report asked to decide hits, and Decision is the
	// owner's decision of them.
	Decided  bool
	Decision algorithms.Decision
	// Share answers a report with Share: the stream may admit ShareBurst
	// at once and ShareRateMilli / 1000 hits a second after (shares.go).
	Share                      bool
	ShareRateMilli, ShareBurst int64
}

// lesseeAccount is one lessee's account of a counter this node owns.
type lesseeAccount struct {
	granted, received, epoch int64
	expires                  time.Time // freed at the first round after it, unless a report renews it
	// answered is false until this node answers a report of the account:
	// until then the account is one it did not lend (a new one, or one
	// kept as heir), and the lessee's claim of what it holds is honoured
	// (see claim).
	answered bool
	// asked and askedAt are the lessee's asked total when its demand was
	// last measured; rate is that demand, in hits a second.
	asked   int64
	askedAt time.Time
	rate    float64
	// credit is the lessee's part of the counter's refill not lent to it
	// yet, in hits, as of creditAt (see topUp).
	credit   float64
	creditAt time.Time
	// interval is the lessee's report interval as topUp counts it (see
	// LeaseReport.Interval), as of its last report.
	interval time.Duration
}

func (a *lesseeAccount) outstanding() int64 { return max(0, a.granted-a.received) }

// checkLeaseReport checks a report's totals: within 0..MaxLeaseTotal,
// acked <= admitted <= asked, and hits within the limit's bound.
func checkLeaseReport(rep *LeaseReport) error {
	field := func(name string, v int64) error {
		if v < 0 || v > MaxLeaseTotal {
			return fmt.Errorf("%s: must be between 0 and %d, got %d: %w", name, int64(MaxLeaseTotal), v, ErrInvalidReport)
		}
		return nil
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"epoch", rep.Epoch}, {"admitted", rep.Admitted}, {"acked", rep.Acked}, {"asked", rep.Asked}, {"granted", rep.Granted}, {"hits", rep.Request.Hits},
		{"share_rate_milli", rep.ShareRateMilli}, {"share_burst", rep.ShareBurst}} {
		if err := field(f.name, f.v); err != nil {
			return err
		}
	}
	switch {
	case rep.Acked > rep.Admitted:
		return fmt.Errorf("acked: must be at most admitted (%d), got %d: %w", rep.Admitted, rep.Acked, ErrInvalidReport)
	case rep.Admitted > rep.Asked:
		return fmt.Errorf("asked: must be at least admitted (%d), got %d: %w", rep.Admitted, rep.Asked, ErrInvalidReport)
	case rep.Request.Reset:
		return fmt.Errorf("reset: not in a lease report: %w", ErrInvalidReport)
	case rep.Share && rep.Request.Hits > 0:
		return fmt.Errorf("hits: not with share: a share decides nothing at the owner: %w", ErrInvalidReport)
	case !rep.Share && (rep.ShareRateMilli != 0 || rep.ShareBurst != 0):
		return fmt.Errorf("share_rate_milli: only with share: %w", ErrInvalidReport)
	case rep.Interval < 0:
		return fmt.Errorf("interval: must not be negative, got %v: %w", rep.Interval, ErrInvalidReport)
	}
	return nil
}

// Lend takes lessee's reports of counters this node owns and answers
// each with the lessee's account: it charges the hits reported, decides
// the hits a report asks to decide, tops the grant up by the lessee's
// share of what is not lent out, and renews the grant's time-to-live. It
// answers a report it does not take with an error (see LeaseGrant.Err):
// an impossible report, a key this node does not own in its ring, or a new
// account beyond a bound. It is safe for concurrent use.
func (n *Node) Lend(lessee Lessee, reports []LeaseReport) []LeaseGrant {
	now := n.now()
	r := n.cluster.Ring()
	self := n.cluster.LocalMember().Name
	out := make([]LeaseGrant, len(reports))
	promoted := false
	for i := range reports {
		rep := &reports[i]
		if err := checkLeaseReport(rep); err != nil {
			out[i].Err = err
			continue
		}
		if owner, ok := r.Owner(rep.Request.Key); ok && owner.Name != self {
			out[i].Err = fmt.Errorf("key %q: owned by %s: %w", rep.Request.Key, owner.Name, ErrNotOwner)
			continue
		}
		if !n.mayLend() {
			out[i].Err = fmt.Errorf("key %q: strict mode, and this owner sees no quorum: %w", rep.Request.Key, ErrNotOwner)
			continue
		}
		if !promoted && n.inherit != nil {
			n.inherit() // replicas of keys just inherited become counters before any is charged (see Config.Inherit)
			promoted = true
		}
		out[i] = n.lend(lessee, rep, now)
		var bound *boundError
		if errors.As(out[i].Err, &bound) {
			n.metrics.leaseRefused.WithLabelValues(bound.reason).Inc()
		}
	}
	return out
}

// lend takes one valid report of a counter this node owns.
func (n *Node) lend(lessee Lessee, rep *LeaseReport, now time.Time) LeaseGrant {
	r := rep.Request
	k := key{r.Name, r.Key}
	sh := n.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l := sh.lease(k, &r, now)
	sh.dirty[k] = struct{}{}
	if rep.Share {
		return n.lendShare(sh, l, lessee, rep, now)
	}
	peek := l.req
	peek.Now = r.Now
	a, fresh, unused, err := n.account(sh, l, lessee, rep, now)
	if err != nil {
		return LeaseGrant{Err: err}
	}
	if a.epoch == rep.Epoch || rep.Release && rep.Epoch > a.epoch {
		n.take(l, a, rep, &peek, fresh, unused, now)
	}
	var g LeaseGrant
	if r.Hits > 0 {
		g.Decided, g.Decision = true, n.decideAgainst(l, &r, l.outstanding())
	}
	if a.epoch == rep.Epoch {
		a.interval = min(max(n.interval, rep.Interval), max(n.interval, n.leases.TTL/2))
		if !rep.Release { // a release gives back: it asks for nothing
			n.topUp(l, a, &peek, n.payDebt(l, &peek, n.store.Check(&peek).Remaining)-l.debt, now)
		}
		a.answered = true
	}
	counter := n.store.Check(&peek)
	one := peek
	one.Hits = 1
	g.Epoch, g.Granted, g.Acked, g.TTL = a.epoch, a.granted, a.received, n.leases.TTL
	g.Remaining = n.lendable(l, a, counter.Remaining-l.debt, now)
	g.ResetAfter, g.RetryAfter = counter.ResetAfter, max(0, n.store.Check(&one).RetryAfter)
	return g
}

// account returns lessee's account of l to take rep into: the one l
// holds, or a new one when l holds none (within the bounds) or rep starts a
// new epoch without a release (the lessee forgot the old account), whose
// unused grant it returns. A report of an older epoch than the account's
// is of an account replaced since: the account is returned as it is, and
// rep is not taken. sh.mu is held.
func (n *Node) account(sh *shard, l *lease, lessee Lessee, rep *LeaseReport, now time.Time) (a *lesseeAccount, fresh bool, unused int64, err error) {
	a = l.lessees[lessee]
	switch {
	case a == nil:
		if err := sh.book.open(lessee, len(l.lessees)); err != nil {
			return nil, false, 0, err
		}
	case rep.Epoch > a.epoch && !rep.Release:
		unused = a.outstanding()
		l.rates -= a.rate
	default:
		return a, false, 0, nil
	}
	// A new account takes the lessee's acknowledged hits as charged
	// already, so that none is charged twice, and measures its demand
	// from here.
	a = &lesseeAccount{epoch: rep.Epoch, received: rep.Acked, granted: rep.Acked, asked: rep.Asked, askedAt: now,
		rate: float64(max(1, rep.Request.Hits)) / n.interval.Seconds()}
	l.lessees[lessee] = a
	l.rates += a.rate
	return a, true, unused, nil
}

// take charges what rep reports of a: the claim of a grant a does not show
// (claim), the hits admitted since the last report, as far as the grant
// covers them, and a release; and it measures the lessee's demand. peek
// is the counter's request, evaluated when rep was made; unused is what
// the lessee's replaced account had left, if fresh. sh.mu is held.
func (n *Node) take(l *lease, a *lesseeAccount, rep *LeaseReport, peek *limiter.Request, fresh bool, unused int64, now time.Time) {
	if !a.answered && rep.Granted > a.granted {
		n.claim(l, a, rep.Granted, unused, peek)
	}
	if delta := rep.Admitted - a.received; delta > 0 {
		charge := min(delta, a.outstanding())
		if charge > 0 {
			c := *peek
			c.Hits = charge
			n.store.Charge(&c)
		}
		if excess := delta - charge; excess > 0 {
			n.metrics.leaseExcess.Add(float64(excess))
		}
		a.received = rep.Admitted
		a.granted = max(a.granted, a.received) // the excess is not lent: the account holds nothing for it
	}
	if rep.Release && rep.Epoch > a.epoch {
		a.epoch = rep.Epoch
		a.granted = max(a.received, min(a.granted, rep.Granted))
	}
	a.expires = now.Add(n.leases.TTL)
	if dt := now.Sub(a.askedAt); !fresh && (rep.Asked > a.asked || dt >= max(n.interval, a.interval)) && rep.Asked >= a.asked {
		// The demand since the last measure (a report that asks nothing
		// new measures it only a report interval after the last: a
		// lessee's server may renew between its client's reports); at most a millisecond's
		// worth is assumed between two reports that come closer, as the
		// first calls of a busy lessee do, so that its grant grows at once
		// rather than a hit or two at a time.
		rate := min(float64(rep.Asked-a.asked)/max(dt, time.Millisecond).Seconds(), demandCap(l.req.Limit, max(n.interval, a.interval)))
		l.rates += rate - a.rate
		a.rate, a.asked, a.askedAt = rate, rep.Asked, now
	}
}

// claim raises a's grant towards what the lessee says it holds, granted,
// for an account this node did not lend (new, or kept as heir): the grant
// was lent by the key's owner before this one (a crash, a ring change), or
// by this node before it freed the account. What it reserves comes from
// what is not lent out (plus unused, what a replaced account of the
// lessee had left), so that no hit is reserved twice: what the lessee
// holds beyond it, it loses when it adopts the answer. sh.mu is held.
func (n *Node) claim(l *lease, a *lesseeAccount, granted, unused int64, peek *limiter.Request) {
	remaining := n.store.Check(peek).Remaining - l.debt
	avail := max(0, remaining-l.outstanding()) + unused
	a.granted += min(granted-a.granted, avail)
}

// topUp lends a, whose counter (r) has remaining hits left (less what it
// owes), its share of what is not lent out, up to leaseRounds intervals of
// its demand: its credit (its weight's part of what the counter refilled
// since its last top-up, at most leaseRounds rounds of it, so that the
// refill is split by demand whatever the order of the calls) or its part
// of what is not lent out, whichever is more. What the other lessees'
// credits and the cluster's own part hold is not lent to it, and it holds
// at most its part of the capacity, so a lessee that lies about its
// demand takes no one's floor (docs/leases.md, "How the owner lends").
// sh.mu is held.
func (n *Node) topUp(l *lease, a *lesseeAccount, r *limiter.Request, remaining int64, now time.Time) {
	p := n.parts(l, now)
	weight := p.weights[a]
	refill := float64(r.Limit.Count) / r.Limit.Period.Seconds() * weight // its part, hits a second
	if !a.creditAt.IsZero() {
		a.credit += refill * now.Sub(a.creditAt).Seconds()
	}
	round := max(n.interval, a.interval).Seconds()
	a.credit = min(a.credit, refill*leaseRounds*round+1)
	a.creditAt = now
	need := n.need(a)
	held := int64(math.Ceil(weight*float64(r.Limit.Capacity()))) - a.outstanding()
	avail := p.avail(n, l, a, remaining)
	if need <= 0 || avail <= 0 || held <= 0 {
		return
	}
	give := min(need, avail, held, max(int64(a.credit), int64(float64(avail)*weight), p.floorHeld(n, a)))
	a.granted += give
	a.credit = max(0, a.credit-float64(give))
}

// need is what a lacks of leaseRounds rounds of its demand.
func (n *Node) need(a *lesseeAccount) int64 {
	return int64(math.Ceil(a.rate*leaseRounds*max(n.interval, a.interval).Seconds())) - a.outstanding()
}

// parts are the lessees' parts of a lease (see split): each lessee's
// weight, its demand's part of its lessees', but at least a quarter of an
// equal part, 1 / (4 × lessees), so that none starves; and, while nodes
// hold grants of the key or its owner decided a GLOBAL check of it within
// a lease time-to-live, the cluster's own part, 1 / (4 × (lessees + 1)),
// which no lessee is lent (reserve, in hits of the capacity).
type parts struct {
	weights  map[*lesseeAccount]float64
	floor    float64
	capacity int64
	reserve  int64
	window   bool // the limit's algorithm is a window's
}

// parts returns l's parts at now. sh.mu is held.
func (n *Node) parts(l *lease, now time.Time) parts {
	cluster := len(l.nodes) > 0 || !l.checkedAt.IsZero() && now.Sub(l.checkedAt) < n.leases.TTL
	p := parts{weights: make(map[*lesseeAccount]float64, len(l.lessees)), floor: 1 / (4 * float64(max(1, len(l.lessees)))),
		capacity: l.req.Limit.Capacity(), window: l.req.Algorithm == limiter.FixedWindow || l.req.Algorithm == limiter.SlidingWindow || l.req.Algorithm == limiter.SlidingLog}
	ps := make([]party, 0, len(l.lessees)+1)
	accounts := make([]*lesseeAccount, 0, len(l.lessees))
	for _, o := range l.lessees {
		ps = append(ps, party{demand: o.rate, floor: p.floor})
		accounts = append(accounts, o)
	}
	if cluster {
		part := 1 / (4 * float64(len(l.lessees)+1))
		ps = append(ps, party{floor: part})
		p.reserve = int64(math.Ceil(part * float64(p.capacity)))
	}
	for i, w := range split(ps)[:len(accounts)] {
		p.weights[accounts[i]] = w
	}
	return p
}

// floored reports whether a is held at its floor.
func (p parts) floored(a *lesseeAccount) bool { return p.weights[a] <= p.floor*(1+1e-9) }

// floorHeld is what a lessee held at its floor may hold of its floor's
// part of a window's capacity, up to its need: a window refills all at
// once, at its start, so a lessee that asks little is lent that at once,
// whatever the others took before it. Zero for a lessee above its floor,
// and for a limit that refills continuously, where its credit is what it
// is owed.
func (p parts) floorHeld(n *Node, a *lesseeAccount) int64 {
	return min(n.need(a), p.floorKept(a))
}

// floorKept is what of a window's capacity is kept for a, if it is held
// at its floor: its floor's part, less what it holds.
func (p parts) floorKept(a *lesseeAccount) int64 {
	if !p.window || !p.floored(a) {
		return 0
	}
	return int64(math.Ceil(p.floor*float64(p.capacity))) - a.outstanding()
}

// avail is what is not lent out of remaining, less the cluster's part and
// what the lessees held at their floors other than a are owed (their
// credits, or what is kept of a window for them). sh.mu is held.
func (p parts) avail(n *Node, l *lease, a *lesseeAccount, remaining int64) int64 {
	avail := remaining - l.outstanding() - p.reserve
	for _, o := range l.lessees {
		if o != a && p.floored(o) {
			avail -= max(int64(o.credit), p.floorKept(o))
		}
	}
	return avail
}

// lendable is what l would lend a now, of its counter's remaining hits:
// what the lessee is told the owner has not lent out, so that it asks
// again within the round (step 2 of docs/leases.md) only when its share
// is worth a call, and a lessee that calls often takes no more than it.
// sh.mu is held.
func (n *Node) lendable(l *lease, a *lesseeAccount, remaining int64, now time.Time) int64 {
	p := n.parts(l, now)
	avail := max(0, p.avail(n, l, a, remaining))
	return min(avail, max(int64(a.credit), int64(float64(avail)*p.weights[a]), p.floorHeld(n, a)))
}

// expire frees the accounts of l whose time-to-live ran out before now,
// and reports whether it freed any. sh.mu is held.
func (n *Node) expire(sh *shard, l *lease, now time.Time) bool {
	freed := false
	for lessee, a := range l.lessees {
		if now.After(a.expires) {
			delete(l.lessees, lessee)
			l.rates -= a.rate
			sh.book.close(lessee)
			n.metrics.leaseExpired.Inc()
			freed = true
		}
	}
	return freed
}

// dropLease forgets k's lease and its lessee accounts. sh.mu is held.
func (sh *shard) dropLease(k key) {
	if l := sh.leases[k]; l != nil {
		for lessee := range l.lessees {
			sh.book.close(lessee)
		}
		for lessee := range l.shares {
			sh.book.close(lessee)
		}
	}
	delete(sh.leases, k)
	delete(sh.dirty, k)
}

// lesseeGrants returns l's lessee accounts that hold hits lent and not
// reported used, as the key's heir keeps them. sh.mu is held.
func (l *lease) lesseeGrants() []*peerpb.LesseeGrant {
	var out []*peerpb.LesseeGrant
	for lessee, a := range l.lessees {
		if a.outstanding() == 0 {
			continue
		}
		out = append(out, &peerpb.LesseeGrant{Lessee: lessee[:], Granted: a.granted, Received: a.received, Epoch: a.epoch})
	}
	return out
}

// book counts the lessee accounts of a node's leases, to bound them. It
// is safe for concurrent use; a shard's lock may be held while it is
// called, never the other way round.
type book struct {
	conf     LeaseConfig
	mu       sync.Mutex
	keys     map[Lessee]int // accounts by lessee
	accounts int
	// kept is the lessee accounts kept as heir (heir.go), bounded apart.
	kept atomic.Int64
}

// boundError is the error of a new account beyond a bound: reason is the
// label of ringlimit_lease_refused_total.
type boundError struct {
	reason, flag string
	max          int
}

func (e *boundError) Error() string {
	if e.flag == "" {
		return fmt.Sprintf("a node holds at most %d lessee accounts", e.max)
	}
	return fmt.Sprintf("%s %d reached", e.flag, e.max)
}

func (e *boundError) Unwrap() error { return ErrLeaseBound }

// open counts a new account of lessee for a key that has perKey already,
// or returns the error of the bound it would pass.
func (b *book) open(lessee Lessee, perKey int) error {
	if perKey >= b.conf.MaxLeasesPerKey {
		return &boundError{"per_key", "--max-leases-per-key", b.conf.MaxLeasesPerKey}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	held := b.keys[lessee]
	switch {
	case held == 0 && len(b.keys) >= b.conf.MaxLessees:
		return &boundError{"lessees", "--max-lessees", b.conf.MaxLessees}
	case held >= b.conf.MaxKeysPerLessee:
		return &boundError{"per_lessee", "--max-keys-per-lessee", b.conf.MaxKeysPerLessee}
	case b.accounts >= b.conf.MaxAccounts:
		return &boundError{"total", "", b.conf.MaxAccounts}
	}
	b.keys[lessee]++
	b.accounts++
	return nil
}

// add counts an account this node inherited, whatever the bounds: it
// holds hits a lessee may still admit, and a bound is for new accounts.
func (b *book) add(lessee Lessee) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.keys[lessee]++
	b.accounts++
}

// close counts an account of lessee gone.
func (b *book) close(lessee Lessee) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.keys[lessee]--; b.keys[lessee] <= 0 {
		delete(b.keys, lessee)
	}
	b.accounts--
}

// counts returns the lessees and accounts counted.
func (b *book) counts() (lessees, accounts int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.keys), b.accounts
}
