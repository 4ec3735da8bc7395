package e2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/ring"
)

// rawLessee drives the lessee protocol by hand, through one node, as a
// client that reports one key does: running totals, one account.
type rawLessee struct {
	rl     pb.RateLimiterClient
	secret []byte
	item   *pb.CheckItem

	mu                                     sync.Mutex
	epoch, admitted, acked, asked, granted int64
}

func newRawLessee(t *testing.T, n *node, item *pb.CheckItem) *rawLessee {
	t.Helper()
	cc, err := grpc.NewClient(n.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &rawLessee{rl: pb.NewRateLimiterClient(cc), secret: fmt.Appendf(nil, "%016d", time.Now().UnixNano()%1e16), item: item, epoch: 1}
}

// report sends the account, asking to decide hits, and adopts the answer.
func (l *rawLessee) report(hits int64) (*pb.LeaseGrant, error) {
	l.mu.Lock()
	l.asked += hits
	rep := &pb.LeaseReport{Item: l.item, Epoch: l.epoch, Admitted: l.admitted, Acked: l.acked, Asked: l.asked, Granted: l.granted, Hits: hits}
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	resp, err := l.rl.Lease(ctx, &pb.LeaseRequest{Lessee: l.secret, Reports: []*pb.LeaseReport{rep}})
	if err != nil {
		return nil, err
	}
	g := resp.GetGrants()[0]
	if g.GetError() != "" {
		return g, fmt.Errorf("report: %s", g.GetError())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if g.GetEpoch() == l.epoch {
		l.acked, l.granted = max(l.acked, g.GetAcked()), g.GetGranted()
	}
	return g, nil
}

// use admits n hits from the grant, as far as it goes, and returns how
// many it admitted.
func (l *rawLessee) use(n int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	n = min(n, l.granted-l.admitted)
	l.admitted += n
	l.asked += n
	return n
}

// ask counts n hits asked and refused: demand the next report shows.
func (l *rawLessee) ask(n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked += n
}

// globalChecks sends GLOBAL checks of item, one at a time, paced, through
// nodes, until stop is closed, and counts those admitted.
func globalChecks(t *testing.T, nodes []*node, item *pb.CheckItem, stop chan struct{}, admitted *atomic.Int64) *sync.WaitGroup {
	var wg sync.WaitGroup
	it := &pb.CheckItem{Name: item.Name, Key: item.Key, Limit: item.Limit, DurationMs: item.DurationMs, Algorithm: item.Algorithm, Behavior: pb.Behavior_GLOBAL}
	for _, n := range nodes {
		wg.Go(func() {
			for range 10_000 {
				select {
				case <-stop:
					return
				default:
				}
				if res, err := check(n, it); err == nil && res.Error == "" && res.Status == pb.Status_UNDER_LIMIT {
					admitted.Add(1)
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	return &wg
}

// keyOf returns a key that r gives to owner and whose heir, without
// owner, is heir (any, if heir is "").
func keyOf(r *ring.Ring, owner, heir string) string {
	var heirs ring.Heirs
	for i := 0; ; i++ {
		k := fmt.Sprint("lease:", i)
		o, _ := r.Owner(k)
		h, _ := heirs.Heir(r, owner, k)
		if o.Name == owner && (heir == "" || h.Name == heir) {
			return k
		}
	}
}

func ringOf(names ...string) *ring.Ring {
	var ms []ring.Member
	for _, n := range names {
		ms = append(ms, ring.Member{Name: n})
	}
	return ring.New(ms...)
}

// TestLeaseOwnerKilled: a lessee holds most of a key's limit, lent by the
// key's owner, which is then killed with SIGKILL. The key's heir kept the
// lessee's account from the owner's broadcasts: while the owner cannot be
// reached, and once the heir owns the key, the other nodes' checks get
// only what the lessee does not hold, and the lessee's report of the rest
// of its grant, spent after the kill, is charged in full by the new owner.
// Nothing is admitted beyond the limit.
func TestLeaseOwnerKilled(t *testing.T) {
	const limit = 1000
	c := startCluster(t, 3)
	victim, survivors := c.nodes[2], c.nodes[:2]
	key := keyOf(ringOf(c.nodes[0].name, c.nodes[1].name, c.nodes[2].name), victim.name, "")
	item := &pb.CheckItem{Name: "api", Key: key, Limit: limit, DurationMs: year, Algorithm: pb.Algorithm_FIXED_WINDOW}
	l := newRawLessee(t, survivors[0], item) // relayed to the owner
	g, err := l.report(1)
	if err != nil || g.GetDecided().GetStatus() != pb.Status_UNDER_LIMIT {
		t.Fatalf("first report: %v %v", g, err)
	}
	l.ask(100_000) // busy: asks far more than it is lent
	time.Sleep(10 * time.Millisecond)
	if g, err = l.report(0); err != nil {
		t.Fatal(err)
	}
	held := g.GetGranted()
	if held < limit/2 {
		t.Fatalf("the lessee holds %d, want most of the limit %d", held, limit)
	}
	half := l.use(held / 2)
	if _, err := l.report(0); err != nil {
		t.Fatal(err)
	}
	broadcastsAfterNow(t, victim) // the heir keeps the grants as the owner has them
	replicated(t, victim)
	victim.signal(t, syscall.SIGKILL)
	if !victim.wait(5 * time.Second) {
		t.Fatalf("%s did not exit after SIGKILL", victim.name)
	}
	rest := l.use(held) // within three quarters of its time-to-live of the last report

	var others atomic.Int64
	stop := make(chan struct{})
	wg := globalChecks(t, survivors, item, stop, &others)
	conv := c.waitConverged(2)
	var late *pb.LeaseGrant
	poll(t, convergeTimeout, "the lessee's report reaches the new owner", func() (bool, string) {
		late, err = l.report(0)
		return err == nil, fmt.Sprint(err)
	})
	time.Sleep(time.Second) // load on the new owner
	close(stop)
	wg.Wait()

	total := 1 + half + rest + others.Load()
	t.Logf("lessee: %d held, %d spent before the kill, %d after; others %d; ring converged %v after the kill; %d in all", held, half, rest, others.Load(), conv.Round(time.Millisecond), total)
	if late.GetAcked() != half+rest {
		t.Errorf("the new owner acknowledged %d of the lessee's %d admitted", late.GetAcked(), half+rest)
	}
	for _, n := range survivors {
		if excess, err := metric(n, "ringlimit_lease_excess_hits_total"); err != nil || excess != 0 {
			t.Errorf("%s: %v hits beyond the lessee's grant (%v): its grant was not kept", n.name, excess, err)
		}
	}
	if total > limit {
		t.Errorf("%d admitted in all, over the limit %d", total, limit)
	}
}

// broadcastsAfterNow returns once n has ended two GLOBAL sync rounds
// (ringlimit_global_sync_seconds) since it was called: one that began
// after the call, whose broadcast carries n's state as of then to the
// other nodes. A fixed sleep fell short on a busy machine, and the heir
// then lent the lessee's grant again (13 over the limit).
func broadcastsAfterNow(t *testing.T, n *node) {
	t.Helper()
	rounds := func() float64 { v, _ := metric(n, "ringlimit_global_sync_seconds_count"); return v }
	from := rounds()
	poll(t, keepTimeout, n.name+" broadcasts its state", func() (bool, string) {
		r := rounds()
		return r >= from+2, fmt.Sprintf("%v sync rounds since", r-from)
	})
}

// TestLeaseRingChange: a lessee renewing its grant every round while a
// node joins and takes its key over, and other nodes' GLOBAL checks go on
// throughout: the lessee's report to the new owner claims what the old one
// lent it, the new owner charges what it spent from it in full, and in all
// no more is admitted than the limit and the bound of a ring change, the
// lessee's grant at the change (which the new owner can lend to others
// before the lessee's claim reaches it).
func TestLeaseRingChange(t *testing.T) {
	const limit = 1000
	c := startCluster(t, 2)
	names := []string{c.nodes[0].name, c.nodes[1].name, "e2e-2"}
	var key string
	for i := 0; key == ""; i++ {
		k := fmt.Sprint("moving:", i)
		if o, _ := ringOf(names...).Owner(k); o.Name == "e2e-2" {
			key = k
		}
	}
	item := &pb.CheckItem{Name: "api", Key: key, Limit: limit, DurationMs: hour, Algorithm: pb.Algorithm_SLIDING_LOG}
	l := newRawLessee(t, c.nodes[0], item)
	if _, err := l.report(1); err != nil {
		t.Fatal(err)
	}
	l.ask(100_000)
	time.Sleep(10 * time.Millisecond)
	g, err := l.report(0)
	if err != nil {
		t.Fatal(err)
	}
	l.use(g.GetGranted() / 2)
	if g, err = l.report(0); err != nil {
		t.Fatal(err)
	}
	held := g.GetGranted() - g.GetAcked() // at the change

	var others atomic.Int64
	stopOthers := make(chan struct{})
	checks := globalChecks(t, c.nodes, item, stopOthers, &others)
	stop := make(chan struct{})
	var renewals sync.WaitGroup
	renewals.Go(func() { // the lessee renews every round, spending a little, through the change
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			l.use(2)
			l.ask(2_000) // and asks for as much as it holds, so that it keeps it
			l.report(0)  // a report that fails goes again next round
		}
	})
	c.add()
	c.waitConverged(3)
	time.Sleep(time.Second) // the lessee's reports reach the new owner
	close(stop)
	renewals.Wait()
	rest := l.use(limit) // what it still holds, spent now
	if g, err = l.report(0); err != nil || g.GetAcked() != l.admitted {
		t.Errorf("the new owner's answer: %v %v; want the lessee's %d admitted acknowledged", g, err, l.admitted)
	}
	time.Sleep(time.Second)
	close(stopOthers)
	checks.Wait()
	excess, err := metric(c.nodes[2], "ringlimit_lease_excess_hits_total")
	if err != nil {
		t.Fatal(err)
	}
	total := 1 + l.admitted + others.Load()
	t.Logf("lessee: %d held at the change, %d admitted in all (%d of it at the end); others %d; %d in all; %v hits beyond its grant at the new owner",
		held, l.admitted, rest, others.Load(), total, excess)
	if total > limit+held {
		t.Errorf("%d admitted in all, over the limit %d and the lessee's grant at the change, %d", total, limit, held)
	}
	if int64(excess) > held {
		t.Errorf("%v hits beyond the lessee's grant at the new owner, more than it held at the change (%d)", excess, held)
	}
}

// TestLeaseAccuracy is the accuracy run of issue 20: 8 leased Go clients
// over 3 nodes on one key, asking far more than its limit for 60 s. The
// bound is asserted window by window: never more than the limit. Use is a
// figure (docs/bench/leases.md quotes each window's, logged here): the test asks
// at least 95% of the limit over the whole run and 80% in every window,
// because when the machine is loaded by other work besides (go test runs
// every package at once on 2 cores) the callers of one window can wait to
// be scheduled, and a window goes unused for want of asking, not for
// grants stranded on idle clients, which would cost every window alike.
func TestLeaseAccuracy(t *testing.T) {
	const (
		window  = 5 * time.Second
		limit   = 5000 // 1,000 a second; asked about 14,000
		clients = 8
		run     = 60 * time.Second
	)
	c := startCluster(t, 3)
	l := client.Limit{Name: "accuracy", Count: limit, Period: window, Algorithm: client.FixedWindow, Lease: true}
	start := time.Now().Truncate(window).Add(window) // a whole window
	windows := make([]atomic.Int64, run/window+2)
	var wg sync.WaitGroup
	for i := range clients {
		cl, err := client.New(c.nodes[i%3].grpc)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		for range 2 {
			wg.Go(func() {
				paced(cl, l, "hot", start.Add(-window/2), start.Add(run), func(now time.Time) {
					if !now.Before(start) {
						windows[int(now.Sub(start)/window)].Add(1)
					}
				})
			})
		}
	}
	wg.Wait()
	var total int64
	for w := range run / window {
		got := windows[w].Load()
		total += got
		t.Logf("window %d: %d admitted of %d", w, got, limit)
		if got > limit {
			t.Errorf("window %d: %d admitted, over the limit %d", w, got, limit)
		}
		if got < limit*80/100 {
			t.Errorf("window %d: %d admitted, under 80%% of the limit %d", w, got, limit)
		}
	}
	if most := int64(run/window) * limit; total < most*95/100 {
		t.Errorf("%d admitted in the run's %d windows, under 95%% of their %d", total, run/window, most)
	}
}

// TestLeaseSkew: 8 leased clients over 3 nodes asking alike more than a
// bucket refills; then one of them asks 70% of the demand, and from the
// second round on it gets more than half of the admissions over the run's
// seconds, and at least 40% in each second after the first (an even split
// would give it 12.5%). Each 200ms and each second is logged: their
// shares are the figure docs/bench/leases.md quotes (60% or more within two
// rounds on a quiet machine). (Callers share the test's process, and this machine's 2 cores
// with the 3 nodes: when it is loaded by other work besides, as when go
// test runs every package at once, the first rounds after the skew can go
// either way, as the 28 callers that start it wait to be scheduled and
// rounds run late; the split by demand itself is tested exactly, on an
// injected clock, in global/lessees_test.go.)
func TestLeaseSkew(t *testing.T) {
	const (
		rate   = 2000 // a second
		round  = 100 * time.Millisecond
		even   = 3 * time.Second
		skewed = 5 * time.Second
		slice  = 2 * round
		second = int(time.Second / slice)
	)
	c := startCluster(t, 3)
	l := client.Limit{Name: "skew", Count: rate, Period: time.Second, Burst: 4 * rate / 10, Algorithm: client.TokenBucket, Lease: true}
	start := time.Now().Add(500 * time.Millisecond)
	skewAt := start.Add(even)
	from := skewAt.Add(2 * round)
	slices := int(skewed / slice)
	mine, all := make([]atomic.Int64, slices), make([]atomic.Int64, slices)
	count := func(big bool) func(time.Time) {
		return func(now time.Time) {
			i := int(now.Sub(from) / slice)
			if now.Before(from) || i >= slices {
				return
			}
			all[i].Add(1)
			if big {
				mine[i].Add(1)
			}
		}
	}
	var wg sync.WaitGroup
	for i := range 8 {
		cl, err := client.New(c.nodes[i%3].grpc)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		callers := 2 // 16 callers asking alike, about 14,000 a second: 7 times the rate
		if i == 0 {
			callers = 30 // then 30 against 14 others: 68%
		}
		for k := range callers {
			begin := start
			if i == 0 && k >= 2 {
				begin = skewAt
			}
			wg.Go(func() { paced(cl, l, "skewed", begin, skewAt.Add(skewed), count(i == 0)) })
		}
	}
	wg.Wait()
	var m, a, mAll, aAll int64
	for i := range slices - 1 { // the last is cut short by the run's end
		m, a = m+mine[i].Load(), a+all[i].Load()
		t.Logf("rounds %d-%d of the skew: %d of %d admissions to the client asking 70%%", 2*i+2, 2*i+3, mine[i].Load(), all[i].Load())
		if (i+1)%second == 0 {
			n := (i + 1) / second
			t.Logf("second %d from round 2 of the skew: %d of %d admissions (%.0f%%)", n, m, a, 100*float64(m)/float64(max(a, 1)))
			if n > 1 && float64(m) < 0.4*float64(a) {
				t.Errorf("second %d from round 2 of the skew: the client asking 70%% got %d of %d admissions, want at least 40%%", n, m, a)
			}
			mAll, aAll, m, a = mAll+m, aAll+a, 0, 0
		}
	}
	if 2*mAll <= aAll {
		t.Errorf("from round 2 of the skew: the client asking 70%% got %d of %d admissions, want more than half", mAll, aAll)
	}
}

// paced calls Allow on key from from until until, about every
// millisecond, and passes the time of each admission to admitted.
func paced(cl *client.Client, l client.Limit, key string, from, until time.Time, admitted func(time.Time)) {
	time.Sleep(time.Until(from))
	for now := time.Now(); now.Before(until); now = time.Now() {
		if ok, _ := cl.Allow(context.Background(), l, key); ok {
			admitted(now)
		}
		time.Sleep(time.Millisecond)
	}
}
