package global

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// fakeCluster is one member's view of a ring that tests change.
type fakeCluster struct {
	ring atomic.Pointer[ring.Ring]
	self ring.Member
}

func (c *fakeCluster) Ring() *ring.Ring         { return c.ring.Load() }
func (c *fakeCluster) LocalMember() ring.Member { return c.self }

// fakePeers delivers GLOBAL traffic between Nodes in this process, by
// peer address (the member's name), and records the broadcasts.
type fakePeers struct {
	mu    sync.Mutex
	nodes map[string]*Node
	sent  map[string][]*peerpb.GlobalState // by receiver
}

func (p *fakePeers) AddGlobalHits(_ context.Context, addr, from string, reports []*peerpb.GlobalReport) error {
	p.mu.Lock()
	n := p.nodes[addr]
	p.mu.Unlock()
	if n == nil {
		return errors.New("unreachable")
	}
	return n.Receive(from, reports)
}

func (p *fakePeers) UpdateGlobals(_ context.Context, addr, from string, states []*peerpb.GlobalState) error {
	p.mu.Lock()
	n := p.nodes[addr]
	p.sent[addr] = append(p.sent[addr], states...)
	p.mu.Unlock()
	if n == nil {
		return errors.New("unreachable")
	}
	return n.Apply(from, states)
}

// testNodes is Nodes of one ring, at a clock the test moves.
type testNodes struct {
	now      time.Time
	peers    *fakePeers
	clusters map[string]*fakeCluster
	nodes    map[string]*Node
	regs     map[string]*prometheus.Registry
}

// newTestNodes returns a Node for each name, all in one ring, with leases
// bounded by conf.
func newTestNodes(t *testing.T, conf LeaseConfig, names ...string) *testNodes {
	t.Helper()
	tn := &testNodes{now: t0, peers: &fakePeers{nodes: map[string]*Node{}, sent: map[string][]*peerpb.GlobalState{}},
		clusters: map[string]*fakeCluster{}, nodes: map[string]*Node{}, regs: map[string]*prometheus.Registry{}}
	var members []ring.Member
	for _, name := range names {
		members = append(members, ring.Member{Name: name, PeerAddr: name})
	}
	r := ring.New(members...)
	for _, m := range members {
		c := &fakeCluster{self: m}
		c.ring.Store(r)
		reg := prometheus.NewRegistry()
		n := New(Config{Store: limiter.New(limiter.Config{}), Cluster: c, Peers: tn.peers, Interval: 100 * time.Millisecond,
			Now: func() time.Time { return tn.now }, Registerer: reg, Leases: conf})
		tn.clusters[m.Name], tn.nodes[m.Name], tn.regs[m.Name] = c, n, reg
		tn.peers.nodes[m.Name] = n
	}
	return tn
}

// setRing gives every node the ring of names.
func (tn *testNodes) setRing(names ...string) {
	var members []ring.Member
	for _, name := range names {
		members = append(members, ring.Member{Name: name, PeerAddr: name})
	}
	r := ring.New(members...)
	for _, c := range tn.clusters {
		c.ring.Store(r)
	}
}

// keyOwnedBy returns a key that owner owns and, if heir is not empty,
// that heir would inherit.
func (tn *testNodes) keyOwnedBy(owner, heir string) string {
	r := tn.clusters[owner].Ring()
	var heirs ring.Heirs
	for i := 0; ; i++ {
		k := fmt.Sprint("k", i)
		o, _ := r.Owner(k)
		h, _ := heirs.Heir(r, owner, k)
		if o.Name == owner && (heir == "" || h.Name == heir) {
			return k
		}
	}
}

// remaining is what the counter of r has left on n, not counting grants.
func remaining(n *Node, r limiter.Request) int64 {
	r.Hits = 0
	return n.store.Check(&r).Remaining
}

// lessee is a lessee that follows the protocol: it admits only from the
// grant its owner last answered, and keeps the running totals.
type lessee struct {
	id                                     Lessee
	epoch, admitted, acked, asked, granted int64
	release                                bool
}

func newLessee(i int) *lessee {
	return &lessee{id: LesseeOf([]byte(fmt.Sprint("secret-", i))), epoch: int64(i+1) << 20}
}

// take admits hits from the grant if it has them, counting them asked.
func (l *lessee) take(hits int64) bool {
	l.asked += hits
	if l.admitted+hits > l.granted {
		return false
	}
	l.admitted += hits
	return true
}

// giveBack gives back all but keep of the grant.
func (l *lessee) giveBack(keep int64) {
	l.epoch++
	l.granted = min(l.granted, l.admitted+keep)
	l.release = true
}

func (l *lessee) report(r limiter.Request, hits int64) LeaseReport {
	r.Hits = hits
	return LeaseReport{Request: r, Epoch: l.epoch, Admitted: l.admitted, Acked: l.acked, Asked: l.asked + hits, Granted: l.granted, Release: l.release}
}

// apply adopts the owner's answer, as the client does.
func (l *lessee) apply(t *testing.T, g LeaseGrant) {
	t.Helper()
	if g.Err != nil {
		t.Fatalf("lease report refused: %v", g.Err)
	}
	if g.Epoch != l.epoch {
		return
	}
	l.granted, l.acked, l.release = g.Granted, max(l.acked, g.Acked), false
}

// lend sends l's report of r, with hits to decide, to n and applies the
// answer.
func (l *lessee) lend(t *testing.T, n *Node, r limiter.Request, hits int64) LeaseGrant {
	t.Helper()
	rep := l.report(r, hits)
	l.asked = rep.Asked
	g := n.Lend(l.id, []LeaseReport{rep})[0]
	l.apply(t, g)
	return g
}

func fixedWindow(key string, limit int64, now time.Time) limiter.Request {
	return limiter.Request{Name: "api", Key: key, Algorithm: limiter.FixedWindow,
		Limit: algorithms.Limit{Count: limit, Period: time.Hour}, Now: now}
}

// TestLendProtocol follows one lessee through the protocol on its key's
// owner: the first check decided and a grant lent, reports charged once
// however often they are sent, a grant topped up by demand, more hits
// reported than lent not charged, a give-back, a stale report ignored, and
// a grant freed when its time-to-live runs out.
func TestLendProtocol(t *testing.T) {
	tn := newTestNodes(t, LeaseConfig{}, "a")
	n := tn.nodes["a"]
	l := newLessee(0)
	r := fixedWindow("user:1", 100, t0)

	g := l.lend(t, n, r, 1) // the first check: decided by the owner, a grant lent
	if !g.Decided || !g.Decision.Allowed {
		t.Fatalf("first check: decided %v, %+v; want admitted", g.Decided, g.Decision)
	}
	if g.Granted != 2 || g.Acked != 0 || g.TTL != DefaultLeaseTTL || g.Remaining != 97 {
		t.Fatalf("first grant %+v: want 2 granted (two rounds of one hit a round), 97 not lent out", g)
	}
	if got := remaining(n, r); got != 99 {
		t.Fatalf("counter has %d left, want 99 (the decided hit)", got)
	}

	for range 2 {
		l.take(1)
	}
	tn.now = tn.now.Add(100 * time.Millisecond)
	r.Now = tn.now
	g = l.lend(t, n, r, 0) // a round's report: 2 admitted, demand 20/s
	if g.Acked != 2 || g.Granted != 6 {
		t.Fatalf("after a round: %+v; want 2 acknowledged and the grant topped up to 4 more (two rounds of 2)", g)
	}
	if got := remaining(n, r); got != 97 {
		t.Fatalf("counter has %d left, want 97", got)
	}
	for range 3 { // the same report again, as a resend: charged nothing, lends nothing
		if g2 := n.Lend(l.id, []LeaseReport{l.report(r, 0)})[0]; g2.Acked != 2 || g2.Granted != 6 {
			t.Fatalf("a resent report answered %+v, want the same account", g2)
		}
	}
	if got := remaining(n, r); got != 97 {
		t.Fatalf("after resends the counter has %d left, want 97: a report counted twice", got)
	}

	l.admitted += 10 // 10 admitted against a grant of 4 left: 6 beyond it
	l.asked += 10
	g = l.lend(t, n, r, 0)
	if g.Acked != 12 || g.Granted < 12 {
		t.Fatalf("over-reported: %+v; want 12 acknowledged", g)
	}
	if got := remaining(n, r); got != 93 {
		t.Fatalf("counter has %d left, want 93: only the 4 lent hits charged", got)
	}
	if got := testutil.ToFloat64(n.metrics.leaseExcess); got != 6 {
		t.Errorf("ringlimit_lease_excess_hits_total = %v, want 6", got)
	}

	lent := g.Granted - g.Acked
	l.giveBack(0)
	old := *l
	g = l.lend(t, n, r, 0)
	if g.Epoch != old.epoch || g.Granted != g.Acked || g.Remaining != remaining(n, r) {
		t.Fatalf("after giving back %d: %+v; want nothing held under the new epoch, everything not lent out", lent, g)
	}
	stale := old.report(r, 0)
	stale.Epoch--
	stale.Admitted += 5
	stale.Asked += 5
	if g2 := n.Lend(l.id, []LeaseReport{stale})[0]; g2.Epoch != old.epoch || remaining(n, r) != 93 {
		t.Fatalf("a stale report answered %+v and charged %d; want the account as it is, nothing charged", g2, 93-remaining(n, r))
	}

	l.take(0)
	l.asked += 30
	tn.now = tn.now.Add(100 * time.Millisecond)
	r.Now = tn.now
	if g = l.lend(t, n, r, 0); g.Granted-g.Acked == 0 {
		t.Fatalf("demand again: %+v, want a grant", g)
	}
	tn.now = tn.now.Add(DefaultLeaseTTL - time.Millisecond)
	n.Broadcast(context.Background())
	if got := accounts(n); got != 1 {
		t.Fatalf("%d accounts before the time-to-live ran out, want 1", got)
	}
	tn.now = tn.now.Add(2 * time.Millisecond)
	n.Broadcast(context.Background())
	if got := accounts(n); got != 0 {
		t.Fatalf("%d accounts after the time-to-live ran out, want 0", got)
	}
	if got := testutil.ToFloat64(n.metrics.leaseExpired); got != 1 {
		t.Errorf("ringlimit_lease_expired_total = %v, want 1", got)
	}
}

// accounts returns the lessee accounts n holds.
func accounts(n *Node) int {
	_, a := n.book.counts()
	return a
}

// TestLendForgedAccount: a report under another lessee's epoch and totals,
// but its own id, opens an account of its own; the other's account is as
// it was, and what it holds is not lent again, whatever the forger claims.
func TestLendForgedAccount(t *testing.T) {
	tn := newTestNodes(t, LeaseConfig{}, "a")
	n := tn.nodes["a"]
	r := fixedWindow("user:1", 10, t0)
	victim := newLessee(0)
	victim.lend(t, n, r, 1)
	victim.asked += 1000 // a busy lessee: its next report is lent most of the counter
	tn.now = tn.now.Add(100 * time.Millisecond)
	r.Now = tn.now
	g := victim.lend(t, n, r, 0)
	held := g.Granted - g.Acked
	if held < 5 {
		t.Fatalf("the victim holds %d, want most of the 9 left", held)
	}
	forger := newLessee(1)
	*forger = *victim
	forger.id = LesseeOf([]byte("a guess"))
	forger.granted += 1000 // and claims more than was ever lent
	forger.admitted += 8
	forger.asked += 8
	fg := n.Lend(forger.id, []LeaseReport{forger.report(r, 0)})[0]
	if fg.Err != nil {
		t.Fatal(fg.Err)
	}
	a := n.shard(key{"api", "user:1"}).leases[key{"api", "user:1"}].lessees[victim.id]
	if a.granted != g.Granted || a.received != g.Acked || a.epoch != victim.epoch {
		t.Errorf("the victim's account became %+v, want it as it was: granted %d, received %d", *a, g.Granted, g.Acked)
	}
	if got, lent := remaining(n, r), int64(9); got+held > lent+held || fg.Granted-fg.Acked+held > 9 {
		t.Errorf("the forger holds %d beside the victim's %d of 9, counter %d left: the victim's hits lent twice", fg.Granted-fg.Acked, held, got)
	}
}

// TestLendSplitByDemand: lessees asking more than the counter refills are
// lent in proportion to their demand. Eight ask alike for ten rounds;
// then one asks 70% of the demand, and from the second round on it gets at
// least 60% of the admissions, and none of the others starves.
func TestLendSplitByDemand(t *testing.T) {
	tn := newTestNodes(t, LeaseConfig{}, "a")
	n := tn.nodes["a"]
	// 500 a second, 50 a round, from a burst of four rounds (hits lent
	// and not reported count against a bucket's capacity: see
	// docs/leases.md); asked 100 a round.
	r := limiter.Request{Name: "api", Key: "hot", Algorithm: limiter.TokenBucket,
		Limit: algorithms.Limit{Count: 500, Period: time.Second, Burst: 200}, Now: t0}
	const lessees, skewFrom = 8, 11
	ls := make([]*lessee, lessees)
	for i := range ls {
		ls[i] = newLessee(i)
		ls[i].lend(t, n, r, 1)
	}
	demand := func(i, round int) int64 {
		switch {
		case round < skewFrom:
			return 12 + int64(i%2) // 100 among eight
		case i == 0:
			return 70
		}
		return 4 + int64(i%2) // 30 among seven
	}
	rng := rand.New(rand.NewPCG(1, 2))
	admitted := make([]int64, lessees)
	unlent := make([]int64, lessees) // what each lessee's owner last said it had not lent out
	for round := 1; round < skewFrom+15; round++ {
		var got [lessees]int64
		for i, l := range ls { // each spends from its grant through the round
			for range demand(i, round) {
				switch {
				case l.take(1):
					got[i]++
				case unlent[i] > 0: // spent, while the owner has hits to lend: it decides, and lends
					l.asked--
					g := l.lend(t, n, r, 1)
					unlent[i] = g.Remaining
					if g.Decision.Allowed {
						got[i]++
					}
				}
			}
		}
		tn.now = tn.now.Add(100 * time.Millisecond)
		r.Now = tn.now
		for _, i := range rng.Perm(lessees) { // reports in any order
			unlent[i] = ls[i].lend(t, n, r, 0).Remaining
		}
		n.Broadcast(context.Background())
		if round <= skewFrom {
			continue
		}
		var total int64
		for i := range got {
			total += got[i]
			admitted[i] += got[i]
		}
		t.Logf("round %d of the skew: %v", round-skewFrom+1, got)
		if float64(got[0]) < 0.6*float64(total) {
			t.Errorf("round %d of the skew: the lessee asking 70%% got %d of %d admissions %v, want at least 60%%", round-skewFrom+1, got[0], total, got)
		}
	}
	for i, a := range admitted {
		if a == 0 {
			t.Errorf("lessee %d starved: nothing admitted in the skew", i)
		}
	}
}

// TestLendBounds: a new account beyond a bound is refused with an error
// naming the bound, and counted; the others are answered, and an account
// freed makes room again.
func TestLendBounds(t *testing.T) {
	tn := newTestNodes(t, LeaseConfig{MaxLessees: 3, MaxLeasesPerKey: 2, MaxKeysPerLessee: 2}, "a")
	n := tn.nodes["a"]
	try := func(i int, key string) error {
		return n.Lend(newLessee(i).id, []LeaseReport{newLessee(i).report(fixedWindow(key, 100, tn.now), 1)})[0].Err
	}
	for _, tc := range []struct {
		lessee int
		key    string
		reason string // "" for taken
	}{
		{0, "k1", ""}, {1, "k1", ""},
		{2, "k1", "per_key"},
		{0, "k2", ""},
		{0, "k3", "per_lessee"},
		{2, "k2", ""},
		{3, "k3", "lessees"},
	} {
		err := try(tc.lessee, tc.key)
		if tc.reason == "" {
			if err != nil {
				t.Errorf("lessee %d, %s: %v, want taken", tc.lessee, tc.key, err)
			}
			continue
		}
		var b *boundError
		if !errors.Is(err, ErrLeaseBound) || !errors.As(err, &b) || b.reason != tc.reason || !strings.HasPrefix(err.Error(), "--max-") {
			t.Errorf("lessee %d, %s: %v, want refused by %s naming its flag", tc.lessee, tc.key, err, tc.reason)
		}
		if got := testutil.ToFloat64(n.metrics.leaseRefused.WithLabelValues(tc.reason)); got != 1 {
			t.Errorf("ringlimit_lease_refused_total{reason=%q} = %v, want 1", tc.reason, got)
		}
	}
	if got := gauge(t, tn.regs["a"], "ringlimit_lessees"); got != 3 {
		t.Errorf("ringlimit_lessees = %v, want 3", got)
	}
	tn.now = tn.now.Add(DefaultLeaseTTL + time.Second)
	n.Broadcast(context.Background())
	if err := try(3, "k3"); err != nil {
		t.Errorf("after every account expired: %v, want taken", err)
	}
}

// gauge returns the value of reg's gauge called name.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestLendBadReports: impossible totals and keys this node does not own
// are refused, each with an error naming the field or the owner, and
// charge nothing; the other reports of the call are taken.
func TestLendBadReports(t *testing.T) {
	tn := newTestNodes(t, LeaseConfig{}, "a", "b")
	n := tn.nodes["a"]
	mine, theirs := tn.keyOwnedBy("a", ""), tn.keyOwnedBy("b", "")
	good := newLessee(0).report(fixedWindow(mine, 100, t0), 0)
	bad := func(f func(*LeaseReport)) LeaseReport {
		rep := good
		f(&rep)
		return rep
	}
	for _, tc := range []struct {
		name string
		rep  LeaseReport
		want string
		is   error
	}{
		{"negative admitted", bad(func(r *LeaseReport) { r.Admitted = -1 }), "admitted", ErrInvalidReport},
		{"huge asked", bad(func(r *LeaseReport) { r.Asked = MaxLeaseTotal + 1 }), "asked", ErrInvalidReport},
		{"negative epoch", bad(func(r *LeaseReport) { r.Epoch = -5 }), "epoch", ErrInvalidReport},
		{"acked over admitted", bad(func(r *LeaseReport) { r.Admitted, r.Acked, r.Asked = 1, 2, 2 }), "acked", ErrInvalidReport},
		{"admitted over asked", bad(func(r *LeaseReport) { r.Admitted, r.Asked = 3, 2 }), "asked", ErrInvalidReport},
		{"negative granted", bad(func(r *LeaseReport) { r.Granted = -1 }), "granted", ErrInvalidReport},
		{"reset", bad(func(r *LeaseReport) { r.Request.Reset = true }), "reset", ErrInvalidReport},
		{"not the owner", bad(func(r *LeaseReport) { r.Request.Key = theirs }), "owned by b", ErrNotOwner},
	} {
		gs := n.Lend(LesseeOf([]byte("x")), []LeaseReport{tc.rep, good})
		if err := gs[0].Err; !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
		if gs[1].Err != nil {
			t.Errorf("%s: the good report beside it: %v", tc.name, gs[1].Err)
		}
	}
	if got := remaining(n, fixedWindow(mine, 100, t0)); got != 100 {
		t.Errorf("bad reports charged %d hits", 100-got)
	}
	zero := bad(func(r *LeaseReport) { r.Epoch, r.Granted = 0, 0 }) // all zero: a valid, empty account
	if g := n.Lend(LesseeOf([]byte("y")), []LeaseReport{zero})[0]; g.Err != nil {
		t.Errorf("a report of zeros: %v, want taken", g.Err)
	}
}

// TestLeaseNeverOverLimit: lessees following the protocol, whose reports
// and answers are lost at random, who give grants back, and the owner's
// own checks, in random order: the counter never admits more than its
// limit in all, but for the unreported hits of lessees that crash.
func TestLeaseNeverOverLimit(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			tn := newTestNodes(t, LeaseConfig{}, "a")
			n := tn.nodes["a"]
			const limit = 1000
			r := fixedWindow("hot", limit, t0)
			ls := make([]*lessee, 6)
			expires := make([]time.Time, len(ls))   // by the lessee's clock: 3/4 of the TTL after it sent the report answered
			delivered := make([]time.Time, len(ls)) // when each lessee's last report got through
			crashed := make([]bool, len(ls))
			var ownerAdmitted, crashedUnreported int64
			for i := range ls {
				ls[i] = newLessee(i)
				delivered[i] = tn.now
			}
			for step := range 3000 {
				i := rng.IntN(len(ls))
				l := ls[i]
				// A lessee reports every round: one whose last report
				// that got through is 200ms old reports now, and this one
				// gets through (the margin of the time-to-live is for
				// reports that do not).
				due := !crashed[i] && tn.now.Sub(delivered[i]) >= 200*time.Millisecond
				switch op := rng.IntN(10); {
				case crashed[i]:
				case op >= 5 && op < 8 || due: // a report; the call or its answer may be lost, but not when due
					hits := int64(rng.IntN(3))
					rep := l.report(fixedWindow("hot", limit, tn.now), hits)
					sent := tn.now
					if !due && rng.IntN(4) == 0 {
						continue
					}
					delivered[i] = sent
					g := n.Lend(l.id, []LeaseReport{rep})[0]
					if g.Decided && g.Decision.Allowed {
						ownerAdmitted += hits
					}
					l.asked = rep.Asked
					if !due && rng.IntN(4) == 0 {
						continue
					}
					if g.Epoch == l.epoch {
						expires[i] = sent.Add(g.TTL * 3 / 4)
					}
					l.apply(t, g)
				case op < 5: // checks, from the grant while it lasts
					for range rng.IntN(20) {
						if tn.now.Before(expires[i]) {
							l.take(1)
						} else {
							l.asked++
						}
					}
				case op < 9:
					if !l.release {
						l.giveBack(int64(rng.IntN(5)))
					}
				default:
					if rng.IntN(50) == 0 {
						crashed[i] = true
						crashedUnreported += l.admitted - l.acked
					}
				}
				if rng.IntN(5) == 0 {
					d, _ := n.Decide(&limiter.Request{Name: "api", Key: "hot", Algorithm: limiter.FixedWindow, Limit: r.Limit, Hits: 1, Now: tn.now}, "a")
					if d.Allowed {
						ownerAdmitted++
					}
				}
				tn.now = tn.now.Add(time.Duration(rng.IntN(40)) * time.Millisecond)
				if rng.IntN(3) == 0 {
					n.Broadcast(context.Background())
				}
				total := ownerAdmitted
				for _, l := range ls {
					total += l.admitted
				}
				if total > limit+crashedUnreported {
					t.Fatalf("step %d: %d admitted in all, over the limit %d plus the %d crashed lessees did not report", step, total, limit, crashedUnreported)
				}
			}
		})
	}
}

// TestHeirKeepsLessees: the owner sends its key's heir, and only the heir,
// the lessees' accounts; while the owner cannot be reached, even past the
// lessees' time-to-live, the heir decides less what they hold, and once it
// owns the key it starts from them: the lessee's next report is charged in
// full and nothing it holds is lent to another.
func TestHeirKeepsLessees(t *testing.T) {
	tn := newTestNodes(t, LeaseConfig{}, "a", "b", "c")
	key := tn.keyOwnedBy("a", "b")
	r := fixedWindow(key, 100, t0)
	l := newLessee(0)
	l.lend(t, tn.nodes["a"], r, 1)
	l.asked += 200
	tn.now = tn.now.Add(100 * time.Millisecond)
	r.Now = tn.now
	g := l.lend(t, tn.nodes["a"], r, 0)
	held := g.Granted - g.Acked
	if held < 50 {
		t.Fatalf("the lessee holds %d, want most of the counter", held)
	}
	tn.nodes["a"].Broadcast(context.Background())
	for name, want := range map[string]int{"b": 1, "c": 0} {
		var got int
		for _, st := range tn.peers.sent[name] {
			got += len(st.GetLessees())
		}
		if got != want {
			t.Errorf("%s was sent %d lessee accounts, want %d", name, got, want)
		}
	}
	// a is unreachable, for longer than the lessee's time-to-live (the
	// ring takes seconds to drop a dead node): b decides for it, less what
	// the lessee holds, which it cannot report meanwhile.
	tn.now = tn.now.Add(5 * DefaultLeaseTTL / 2)
	check := limiter.Request{Name: "api", Key: key, Algorithm: limiter.FixedWindow, Limit: r.Limit, Hits: 1, Now: tn.now}
	admitted := 0
	for range 100 {
		if d, _ := tn.nodes["b"].Decide(&check, "b"); d.Allowed {
			admitted++
		}
	}
	if want := int(100 - held); admitted != want {
		t.Errorf("the heir admitted %d, want %d: the counter less the lessee's %d", admitted, want, held)
	}
	// The ring drops a: b owns the key, and the lessee's grant with it.
	tn.setRing("b", "c")
	l.take(held)
	g = l.lend(t, tn.nodes["b"], fixedWindow(key, 100, tn.now), 0)
	if g.Acked != l.admitted || g.Err != nil {
		t.Fatalf("the lessee's report to the new owner: %+v, want its %d admitted acknowledged", g, l.admitted)
	}
	if got := testutil.ToFloat64(tn.nodes["b"].metrics.leaseExcess); got != 0 {
		t.Errorf("the new owner counted %v hits beyond the grant it inherited, want 0", got)
	}
	other := newLessee(1)
	other.asked += 1000
	og := other.lend(t, tn.nodes["b"], fixedWindow(key, 100, tn.now), 0)
	if total := int64(admitted) + l.admitted + (og.Granted - og.Acked); total > 100 {
		t.Errorf("%d admitted or lent in all, over the limit 100", total)
	}
}

// TestLeaseClaimedByNewOwner: a lessee whose account the key's new owner
// does not have (the old owner's last round never reached it) claims what
// it holds: the new owner reserves it, as far as it has not lent it out,
// and charges the hits the lessee admitted from it.
func TestLeaseClaimedByNewOwner(t *testing.T) {
	tn := newTestNodes(t, LeaseConfig{}, "a", "b")
	key := tn.keyOwnedBy("b", "")
	l := newLessee(0)
	l.epoch, l.granted, l.admitted, l.acked, l.asked = 9, 40, 30, 10, 30 // from a's grant: 20 admitted unreported, 10 left
	g := l.lend(t, tn.nodes["b"], fixedWindow(key, 100, t0), 0)
	if g.Acked != 30 || g.Granted < 40 {
		t.Fatalf("claim: %+v; want 30 acknowledged, at least the 40 claimed", g)
	}
	if got := remaining(tn.nodes["b"], fixedWindow(key, 100, t0)); got != 80 {
		t.Errorf("counter has %d left, want 80: the 20 unreported hits charged", got)
	}
	late := newLessee(1)
	late.epoch, late.granted = 3, 1000 // claims more than is not lent out
	lg := late.lend(t, tn.nodes["b"], fixedWindow(key, 100, t0), 0)
	if lg.Granted+g.Granted-g.Acked > 80 {
		t.Errorf("a second claim was reserved %d beside the first's %d of 80 left", lg.Granted, g.Granted-g.Acked)
	}
}

// TestLeaseExpiresInRounds: a lessee that reports once and never again
// holds its grant for one time-to-live; the owner's rounds free it then.
func TestLeaseExpiresInRounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &fakeCluster{self: ring.Member{Name: "a"}}
		c.ring.Store(ring.New(c.self))
		n := New(Config{Store: limiter.New(limiter.Config{}), Cluster: c, Peers: &fakePeers{}})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { n.Run(ctx); close(done) }()
		r := fixedWindow("once", 100, time.Now())
		l := newLessee(0)
		l.asked = 500
		rep := l.report(r, 1)
		g := n.Lend(l.id, []LeaseReport{rep})[0]
		if g.Granted == 0 {
			t.Fatalf("no grant: %+v", g)
		}
		time.Sleep(DefaultLeaseTTL - DefaultInterval)
		synctest.Wait()
		if got := accounts(n); got != 1 {
			t.Fatalf("%d accounts a round before the time-to-live ran out, want 1", got)
		}
		time.Sleep(2 * DefaultInterval)
		synctest.Wait()
		r.Now = time.Now()
		peek := r
		if got := accounts(n); got != 0 {
			t.Fatalf("%d accounts after the time-to-live, want 0", got)
		}
		if g := n.Lend(newLessee(1).id, []LeaseReport{newLessee(1).report(peek, 0)})[0]; g.Remaining+g.Granted-g.Acked != 99 {
			t.Errorf("after the grant expired %d are not lent out and %d lent to a new lessee, want 99 in all", g.Remaining, g.Granted-g.Acked)
		}
		cancel()
		<-done
	})
}

// TestBroadcastChunks: a round's states go in calls of at most
// maxBroadcastBytes, in order, none left out.
func TestBroadcastChunks(t *testing.T) {
	var states []*peerpb.GlobalState
	for i := range 5000 {
		states = append(states, &peerpb.GlobalState{Name: "api", Key: strings.Repeat("k", 500) + fmt.Sprint(i), Limit: 1})
	}
	parts := chunks(states, maxBroadcastBytes)
	if len(parts) < 2 {
		t.Fatalf("%d parts, want several", len(parts))
	}
	var all []*peerpb.GlobalState
	for _, p := range parts {
		size := 0
		for _, st := range p {
			size += len(st.Key) + 10
		}
		if size > maxBroadcastBytes {
			t.Errorf("a part of about %d bytes, over %d", size, maxBroadcastBytes)
		}
		all = append(all, p...)
	}
	if len(all) != len(states) || all[0] != states[0] || all[len(all)-1] != states[len(states)-1] {
		t.Errorf("parts hold %d states, want the %d in order", len(all), len(states))
	}
}

// TestLendReportInterval: a lessee that reports every second (an Envoy
// stream) is topped up to two of its intervals of demand, a lessee of the
// sync interval to two sync rounds; neither beyond half the time-to-live.
func TestLendReportInterval(t *testing.T) {
	for _, tc := range []struct {
		interval time.Duration
		want     int64 // the grant after demand of 1,000 a second
	}{{0, 200}, {time.Second, 2000}, {time.Minute, 2000}} {
		tn := newTestNodes(t, LeaseConfig{}, "a")
		n := tn.nodes["a"]
		l := newLessee(0)
		r := fixedWindow("user:1", 1_000_000, t0)
		rep := l.report(r, 0)
		rep.Interval = tc.interval
		l.apply(t, n.Lend(l.id, []LeaseReport{rep})[0])
		tn.now = tn.now.Add(time.Second)
		l.asked += 1000 // asked in the second: 1,000 a second
		rep = l.report(r, 0)
		rep.Interval = tc.interval
		l.apply(t, n.Lend(l.id, []LeaseReport{rep})[0])
		if l.granted != tc.want {
			t.Errorf("interval %v: granted %d after 1,000 asked a second, want %d", tc.interval, l.granted, tc.want)
		}
	}
	tn := newTestNodes(t, LeaseConfig{}, "a")
	rep := newLessee(0).report(fixedWindow("user:1", 10, t0), 0)
	rep.Interval = -time.Second
	if g := tn.nodes["a"].Lend(newLessee(0).id, []LeaseReport{rep})[0]; !errors.Is(g.Err, ErrInvalidReport) || !strings.Contains(g.Err.Error(), "interval") {
		t.Errorf("a negative interval: %v, want ErrInvalidReport naming it", g.Err)
	}
}

// TestLeaseLiarKeepsHonestFloor is the lying Go lessee of issue 33: one
// lessee's asked grows by 10^9 a round and it admits all it is lent,
// beside an honest lessee asking 5 a round of a limit of 100 a second,
// while another node checks the key as GLOBAL, 3 a round. The honest
// lessee keeps its floor (a quarter of an equal part: 12.5 a second), the
// GLOBAL checks are served, and nothing is admitted over the limit.
func TestLeaseLiarKeepsHonestFloor(t *testing.T) {
	tn := newTestNodes(t, LeaseConfig{}, "a", "b")
	key := tn.keyOwnedBy("a", "")
	r := limiter.Request{Name: "api", Key: key, Algorithm: limiter.FixedWindow, Limit: algorithms.Limit{Count: 100, Period: time.Second}, Now: tn.now}
	liar, honest := newLessee(0), newLessee(1)
	liar.lend(t, tn.nodes["a"], r, 1)
	honest.lend(t, tn.nodes["a"], r, 1)
	const rounds = 100
	var byHonest, byLiar, byGlobal int64
	perSecond := map[int64]int64{}
	for range rounds {
		second := int64(tn.now.Sub(t0) / time.Second)
		// The liar spends all it holds, and claims a vast demand.
		n := liar.granted - liar.admitted
		liar.admitted += n
		liar.asked += 1_000_000_000
		got := n
		for range 5 {
			if honest.take(1) {
				got++
				byHonest++
			}
		}
		byLiar += n
		for range 3 {
			check := r
			check.Hits, check.Now = 1, tn.now
			if d, forward := tn.nodes["b"].Decide(&check, "a"); forward {
				if d, _ = tn.nodes["a"].Decide(&check, "a"); d.Allowed {
					got++
					byGlobal++
				}
			} else if d.Allowed {
				got++
				byGlobal++
			}
		}
		perSecond[second] += got
		tn.now = tn.now.Add(100 * time.Millisecond)
		r.Now = tn.now
		liar.lend(t, tn.nodes["a"], r, 0)
		honest.lend(t, tn.nodes["a"], r, 0)
		tn.nodes["b"].Report(context.Background())
		tn.nodes["a"].Broadcast(context.Background())
	}
	t.Logf("in %d s: the liar admitted %d, the honest lessee %d, GLOBAL checks %d", rounds/10, byLiar, byHonest, byGlobal)
	for s, n := range perSecond {
		if n > 100 {
			t.Errorf("second %d: %d admitted, over the limit of 100", s, n)
		}
	}
	if floor := int64(rounds / 10 * 100 / 8); byHonest < floor*9/10 {
		t.Errorf("the honest lessee admitted %d in %d s, want at least 90%% of its floor, %d", byHonest, rounds/10, floor)
	}
	if byGlobal < rounds/10*5 {
		t.Errorf("GLOBAL checks: %d admitted in %d s, want them served (at least 5 a second)", byGlobal, rounds/10)
	}
}
