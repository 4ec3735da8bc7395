package global

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/limiter"
)

func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		name string
		ps   []party
		want []float64
	}{
		{"none", nil, []float64{}},
		{"one", []party{{5, 0.25}}, []float64{1}},
		{"by demand", []party{{70, 1.0 / 8}, {30, 1.0 / 8}}, []float64{0.7, 0.3}},
		{"a liar keeps the honest one at its floor", []party{{1 << 40, 1.0 / 8}, {50, 1.0 / 8}}, []float64{7.0 / 8, 1.0 / 8}},
		{"no demand: equal", []party{{0, 0.1}, {0, 0.1}}, []float64{0.5, 0.5}},
		{"a party of no demand keeps its floor", []party{{0, 1.0 / 12}, {1 << 40, 1.0 / 8}, {50, 1.0 / 8}}, []float64{1.0 / 12, 1 - 1.0/8 - 1.0/12, 1.0 / 8}},
		{"floors in turn", []party{{1, 0.1}, {2, 0.1}, {100, 0.1}, {100, 0.1}}, []float64{0.1, 0.1, 0.4, 0.4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := split(tc.ps)
			var sum float64
			for i := range got {
				sum += got[i]
				if math.Abs(got[i]-tc.want[i]) > 1e-9 {
					t.Errorf("split(%v) = %v, want %v", tc.ps, got, tc.want)
					break
				}
			}
			if len(got) > 0 && math.Abs(sum-1) > 1e-9 {
				t.Errorf("split(%v) sums to %v, want 1", tc.ps, sum)
			}
		})
	}
}

// stream is an Envoy stream as the owner's shares meet it: it reports
// every interval, renews every half second between, and applies each
// answer within ShareDelivery of it, as rlqs does.
type stream struct {
	lessee                 *lessee
	demand                 float64 // asked a second
	next, renew            time.Time
	rate, burst            float64 // in force at the Envoy
	pending                []pendingShare
	askedFrac, asked, adm  float64
	shareMilli, shareBurst int64 // as last answered: its claim
}

type pendingShare struct {
	at          time.Time
	rate, burst float64
}

func (s *stream) call(t *testing.T, n *Node, r limiter.Request, now time.Time, rng *rand.Rand, report bool) LeaseGrant {
	t.Helper()
	if report {
		s.asked += s.demand * 5
	}
	r.Now = now
	rep := LeaseReport{Request: r, Epoch: s.lessee.epoch, Asked: int64(s.asked), Admitted: int64(s.adm), Acked: int64(s.adm),
		Interval: 5 * time.Second, Share: true, ShareRateMilli: s.shareMilli, ShareBurst: s.shareBurst}
	g := n.Lend(s.lessee.id, []LeaseReport{rep})[0]
	if g.Err != nil {
		t.Fatalf("share report refused: %v", g.Err)
	}
	s.shareMilli, s.shareBurst = g.ShareRateMilli, g.ShareBurst
	s.pending = append(s.pending, pendingShare{at: now.Add(time.Duration(rng.Int64N(int64(ShareDelivery)))),
		rate: float64(g.ShareRateMilli) / 1000, burst: float64(g.ShareBurst)})
	return g
}

// arrive applies the answers that have reached the Envoy by now.
func (s *stream) arrive(now time.Time) {
	keep := s.pending[:0]
	for _, p := range s.pending {
		if p.at.After(now) {
			keep = append(keep, p)
			continue
		}
		s.rate, s.burst = p.rate, p.burst
	}
	s.pending = keep
}

// runShares drives streams on n's key r from t0 for d, calling step at
// every 10 ms with the shares in force, and skew at its time.
func runShares(t *testing.T, tn *testNodes, n *Node, r limiter.Request, ss []*stream, d time.Duration, skew func(time.Duration), step func(time.Duration)) {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 8))
	start := tn.now
	for i, s := range ss {
		s.next = start.Add(time.Duration(i) * 1300 * time.Millisecond)
		s.renew = s.next
	}
	lastRound := start
	for tn.now.Before(start.Add(d)) {
		now := tn.now
		if skew != nil {
			skew(now.Sub(start))
		}
		for _, s := range rng.Perm(len(ss)) {
			st := ss[s]
			switch {
			case !now.Before(st.next):
				st.call(t, n, r, now, rng, true)
				st.next = st.next.Add(5 * time.Second)
				st.renew = now.Add(500 * time.Millisecond)
			case !now.Before(st.renew):
				st.call(t, n, r, now, rng, false)
				st.renew = now.Add(500 * time.Millisecond)
			}
			st.arrive(now)
		}
		if now.Sub(lastRound) >= n.interval {
			n.Broadcast(context.Background())
			lastRound = now
		}
		step(now.Sub(start))
		tn.now = now.Add(10 * time.Millisecond)
	}
}

// TestSharesNeverOverBudget: four streams asking far more than a limit of
// 400 a second, with answers reaching the Envoys at any time within
// ShareDelivery: the shares in force never sum past the budget (so any
// second admits at most the limit), use at least 90% of it in steady
// state, and follow a skew of demand within two report intervals.
func TestSharesNeverOverBudget(t *testing.T) {
	tn := newTestNodes(t, LeaseConfig{}, "a")
	n := tn.nodes["a"]
	r := limiter.Request{Name: "rlqs/second", Key: "edge_tenant_t0_", Algorithm: limiter.FixedWindow,
		Limit: algorithms.Limit{Count: 400, Period: time.Second}, Now: t0}
	ss := make([]*stream, 4)
	for i := range ss {
		ss[i] = &stream{lessee: newLessee(i), demand: 1000}
	}
	const skewAt = 30 * time.Second
	budgetRate, budgetBurst := 400*(1-1.0/BurstDivisor), 400.0/BurstDivisor
	var steady, steadyN, mine, all float64
	runShares(t, tn, n, r, ss, 60*time.Second, func(at time.Duration) {
		if at == skewAt {
			ss[0].demand = 7000
		}
	}, func(at time.Duration) {
		var rate, burst float64
		for _, s := range ss {
			rate += s.rate
			burst += s.burst
		}
		if rate > budgetRate+1e-6 || burst > budgetBurst+1e-6 {
			t.Fatalf("at %v: shares in force sum to %.2f a second and %.2f of burst, over the budget %.2f and %.2f", at, rate, burst, budgetRate, budgetBurst)
		}
		if at >= 10*time.Second && at < skewAt {
			steady += rate
			steadyN++
		}
		if at >= skewAt+10*time.Second {
			mine += ss[0].rate
			all += rate
		}
	})
	if use := steady / steadyN / 400; use < 0.9 {
		t.Errorf("steady state: the shares in force average %.1f%% of the limit, want at least 90%%", 100*use)
	}
	if part := mine / all; part < 0.6 {
		t.Errorf("from two report intervals after the skew: the stream asking 70%% holds %.1f%% of the rates, want at least 60%%", 100*part)
	}
}

// TestShareLiarKeepsHonestFloor is the lying stream of issue 33: one
// stream reports 2^40-1 denied requests every 250 ms, beside an honest
// one asking 50 a second. The honest stream holds at least its floor, a
// quarter of an equal part of the budget, once its first report is
// measured, and the shares never pass the budget.
func TestShareLiarKeepsHonestFloor(t *testing.T) {
	tn := newTestNodes(t, LeaseConfig{}, "a")
	n := tn.nodes["a"]
	r := limiter.Request{Name: "rlqs/second", Key: "edge_tenant_t0_", Algorithm: limiter.FixedWindow,
		Limit: algorithms.Limit{Count: 100, Period: time.Second}, Now: t0}
	honest := &stream{lessee: newLessee(0), demand: 50}
	liar := &stream{lessee: newLessee(1), demand: 0}
	rng := rand.New(rand.NewPCG(3, 4))
	budgetRate := 100 * (1 - 1.0/BurstDivisor)
	var lastLie time.Time
	runShares(t, tn, n, r, []*stream{honest}, 30*time.Second, func(at time.Duration) {
		now := tn.now
		if now.Sub(lastLie) >= 250*time.Millisecond {
			liar.asked += 1<<40 - 1
			liar.call(t, n, r, now, rng, false)
			lastLie = now
		}
		liar.arrive(now)
	}, func(at time.Duration) {
		if sum := honest.rate + liar.rate; sum > budgetRate+1e-6 {
			t.Fatalf("at %v: shares in force %.2f a second, over the budget %.2f", at, sum, budgetRate)
		}
		if at >= 10*time.Second && honest.rate < budgetRate/8-0.01 {
			t.Fatalf("at %v: the honest stream holds %.2f a second, under its floor %.2f (the liar holds %.2f)", at, honest.rate, budgetRate/8, liar.rate)
		}
	})
	t.Logf("the honest stream holds %.2f a second, the liar %.2f", honest.rate, liar.rate)
}

// TestNewBucketIsLentAtOnce: a bucket first reported for a key this node
// has owned in every ring it has seen for a lease time-to-live (and the
// rest of tenureWindow) gets a share in its first answer; one whose key
// has just come to this node, or that a node reports before it has
// watched the ring that long (its own restart), gets only what its
// stream claims until a time-to-live has passed: another owner's shares
// may still be in force at the Envoys. Before tenure, every new bucket
// waited a time-to-live, denied under DENY_ALL fallbacks.
func TestNewBucketIsLentAtOnce(t *testing.T) {
	tn := newTestNodes(t, LeaseConfig{}, "a", "b")
	a := tn.nodes["a"]
	moved := tn.keyOwnedBy("b", "a") // a's once b leaves
	kept := tn.keyOwnedBy("a", "")
	first := func(key string, i int) LeaseGrant { // each call a bucket of its own: a counter of its own name
		t.Helper()
		r := limiter.Request{Name: fmt.Sprint("rlqs/", i), Key: key, Algorithm: limiter.FixedWindow,
			Limit: algorithms.Limit{Count: 400, Period: time.Second}, Now: tn.now}
		s := &stream{lessee: newLessee(i), demand: 100}
		return s.call(t, a, r, tn.now, rand.New(rand.NewPCG(1, 2)), true)
	}

	a.Broadcast(context.Background()) // a starts watching
	tn.now = tn.now.Add(a.tenureWindow() / 2)
	if g := first(kept, 0); g.ShareRateMilli != 0 {
		t.Errorf("a bucket reported before the node watched its ring a window: share %d/1000, want its claim, 0", g.ShareRateMilli)
	}

	tn.now = tn.now.Add(a.tenureWindow())
	tn.setRing("a")
	a.Broadcast(context.Background())
	if g := first(kept, 1); g.ShareRateMilli == 0 || g.ShareBurst == 0 {
		t.Errorf("a new bucket of a key a owned all along: share %d/1000 burst %d, want a share at once", g.ShareRateMilli, g.ShareBurst)
	}
	if g := first(moved, 2); g.ShareRateMilli != 0 {
		t.Errorf("a new bucket of a key a has just inherited: share %d/1000, want its claim, 0", g.ShareRateMilli)
	}
	tn.now = tn.now.Add(a.tenureWindow())
	a.Broadcast(context.Background())
	if g := first(moved, 3); g.ShareRateMilli == 0 {
		t.Errorf("a window after the key moved: share %d/1000, want a share at once", g.ShareRateMilli)
	}
}
