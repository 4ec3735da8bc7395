package service

import (
	"context"
	"encoding"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/policy"
)

// keysOwnedBy returns n keys that the ring gives to node i.
func (c *fakeCluster) keysOwnedBy(i, n int) []string {
	var keys []string
	for k := 0; len(keys) < n; k++ {
		key := fmt.Sprint("key-", k)
		if o, _ := c.ring.Owner(key); o.Name == fmt.Sprint("node-", i) {
			keys = append(keys, key)
		}
	}
	return keys
}

// spend charges one hit of 10 a minute on n counters whose keys node
// owner owns, in s's store: counters for s to hand off.
func (c *fakeCluster) spend(s *Service, owner, n int) {
	minute := algorithms.Limit{Count: 10, Period: time.Minute}
	for _, key := range c.keysOwnedBy(owner, n) {
		s.store.Decide(&limiter.Request{Name: "api", Key: key, Limit: minute, Hits: 1, Now: t0})
	}
}

// encoded returns a fixed-size state's bytes (whose encoding cannot fail).
func encoded(s encoding.BinaryAppender) []byte {
	b, _ := s.AppendBinary(nil)
	return b
}

// TestHandOffRefusalsAreKeptAndCounted hands off, in one batch, a good
// counter and four the new owner must refuse: a record of an unknown
// version, a token bucket a year in the future for a 1/s limit, a fixed
// window counting more than its limit and a sliding log with a hit in the
// future. The good one is merged; the others are refused one by one, kept
// by the sender, counted on both sides, and offered again next time.
func TestHandOffRefusalsAreKeptAndCounted(t *testing.T) {
	regs := make([]*prometheus.Registry, 2)
	var handedOff [][]byte // what the sender is told its owners took, for its final snapshot
	c, svcs := newFakeClusterWith(2, func(i int) Config {
		regs[i] = prometheus.NewRegistry()
		return Config{Registerer: regs[i], HandedOff: func(records [][]byte) { handedOff = append(handedOff, records...) }}
	})
	from, to := svcs[1], svcs[0]
	keys := c.keysOwnedBy(0, 5)
	good, future, overfull, logAhead, newer := keys[0], keys[1], keys[2], keys[3], keys[4]
	minute := algorithms.Limit{Count: 10, Period: time.Minute}
	for _, key := range []string{good, newer} {
		from.store.Decide(&limiter.Request{Name: "api", Key: key, Limit: minute, Hits: 4, Now: t0})
	}
	var log algorithms.SlidingLog
	log.Append(t0.Add(time.Hour).UnixNano(), 1)
	now := t0.UnixNano()
	from.store.Restore([]limiter.Counter{
		{Name: "api", Key: future, Algorithm: limiter.TokenBucket, Limit: algorithms.Limit{Count: 1, Period: time.Second}, Last: now,
			State: encoded(&algorithms.TokenBucket{Full: t0.Add(365 * 24 * time.Hour).UnixNano()})},
		{Name: "api", Key: overfull, Algorithm: limiter.FixedWindow, Limit: minute, Last: now,
			State: encoded(&algorithms.FixedWindow{Start: now, Count: 12})},
		{Name: "api", Key: logAhead, Algorithm: limiter.SlidingLog, Limit: minute, Last: now, State: encoded(&log)},
	})
	// A node of a later version would send newer's record in a format this
	// one does not know.
	c.onHandOff = func(counters []*peerpb.CounterState) {
		for _, cs := range counters {
			var rec limiter.Counter
			if err := rec.UnmarshalBinary(cs.Counter); err == nil && rec.Key == newer {
				cs.Counter[0] = limiter.CounterVersion + 1
			}
		}
	}

	if sent := from.HandOff(context.Background()); sent != 1 {
		t.Errorf("HandOff sent %d counters, want 1", sent)
	}
	if to.store.Len() != 1 {
		t.Errorf("receiver holds %d counters, want 1", to.store.Len())
	}
	var taken limiter.Counter
	if len(handedOff) != 1 || taken.UnmarshalBinary(handedOff[0]) != nil || taken.Key != good {
		t.Errorf("HandedOff got %d records (the first %+v), want only the good counter's", len(handedOff), taken)
	}
	if d := to.store.Check(&limiter.Request{Name: "api", Key: good, Limit: minute, Now: t0}); d.Remaining != 6 {
		t.Errorf("the good counter arrived with %d remaining, want 6", d.Remaining)
	}
	kept := map[string]bool{}
	for c := range from.store.Counters() {
		kept[c.Key] = true
	}
	for _, key := range []string{future, overfull, logAhead, newer} {
		if !kept[key] {
			t.Errorf("refused counter %s was not kept by the sender", key)
		}
	}
	if len(kept) != 4 {
		t.Errorf("sender keeps %d counters, want the 4 refused", len(kept))
	}
	fromReg, toReg := regs[1], regs[0]
	for _, m := range []struct {
		reg               *prometheus.Registry
		direction, reason string
		want              float64
	}{
		{fromReg, "sent", "invalid", 3}, {fromReg, "sent", "unknown_version", 1}, {fromReg, "sent", "unavailable", 0},
		{toReg, "received", "invalid", 3}, {toReg, "received", "unknown_version", 1},
	} {
		if got := metricSum(t, m.reg, "ringlimit_handoff_refused_total", "direction", m.direction, "reason", m.reason); got != m.want {
			t.Errorf("ringlimit_handoff_refused_total{direction=%q,reason=%q} = %v, want %v", m.direction, m.reason, got, m.want)
		}
	}
	if got := metricSum(t, fromReg, "ringlimit_handoff_counters_total", "direction", "sent"); got != 1 {
		t.Errorf("handoff sent = %v, want 1 (refused counters were not taken)", got)
	}
	if got := metricSum(t, toReg, "ringlimit_handoff_counters_total", "direction", "received"); got != 1 {
		t.Errorf("handoff received = %v, want 1", got)
	}

	// Kept counters are offered again at the next hand-off.
	if sent := from.HandOff(context.Background()); sent != 0 || from.store.Len() != 4 {
		t.Errorf("second HandOff sent %d and kept %d, want 0 and 4", sent, from.store.Len())
	}
	if got := metricSum(t, fromReg, "ringlimit_handoff_refused_total", "direction", "sent", "reason", "invalid"); got != 6 {
		t.Errorf("after a second hand-off, refused invalid = %v, want 6", got)
	}
}

// TestHandOffUnreachableOwnerKeepsCounters: when the new owner does not
// answer, every counter stays, and nothing counts as sent.
func TestHandOffUnreachableOwnerKeepsCounters(t *testing.T) {
	c, svcs := newFakeCluster(2)
	c.down["peer-0"] = true
	c.spend(svcs[1], 0, 30)
	if sent := svcs[1].HandOff(context.Background()); sent != 0 || svcs[1].store.Len() != 30 {
		t.Errorf("HandOff to a down owner sent %d and kept %d, want 0 and 30", sent, svcs[1].store.Len())
	}
	delete(c.down, "peer-0")
	if sent := svcs[1].HandOff(context.Background()); sent != 30 || svcs[1].store.Len() != 0 || svcs[0].store.Len() != 30 {
		t.Errorf("HandOff once the owner is back sent %d, kept %d, receiver holds %d; want 30, 0, 30",
			sent, svcs[1].store.Len(), svcs[0].store.Len())
	}
}

// TestHandOffBatchesPerOwner hands off more counters than one RPC carries,
// to two owners at once: every counter reaches its owner.
func TestHandOffBatchesPerOwner(t *testing.T) {
	c, svcs := newFakeCluster(3)
	calls := 0
	c.onHandOff = func(counters []*peerpb.CounterState) {
		calls++
		if len(counters) > peerpb.MaxHandOffCounters {
			t.Errorf("one hand-off RPC of %d counters, more than %d", len(counters), peerpb.MaxHandOffCounters)
		}
	}
	for i, n := range []int{1500, 1200} {
		c.spend(svcs[2], i, n)
	}
	if sent := svcs[2].HandOff(context.Background()); sent != 2700 {
		t.Errorf("HandOff sent %d, want 2700", sent)
	}
	if svcs[0].store.Len() != 1500 || svcs[1].store.Len() != 1200 || svcs[2].store.Len() != 0 {
		t.Errorf("owners hold %d and %d, sender %d; want 1500, 1200, 0", svcs[0].store.Len(), svcs[1].store.Len(), svcs[2].store.Len())
	}
	if calls != 4 { // 1000+500 and 1000+200
		t.Errorf("%d hand-off RPCs, want 4", calls)
	}
}

// roundBetweenLookAndDecision is Policies that resolves every policy to 10
// hits a minute and, on its second call, runs round: Pulled resolves a
// request's policy once to look for its counters and again to decide
// them, so round runs between the look and the decision, as a round of
// hand-off in flight can.
type roundBetweenLookAndDecision struct {
	calls int
	round func()
}

func (p *roundBetweenLookAndDecision) Resolve(string) (*policy.Limit, error) {
	if p.calls++; p.calls == 2 {
		p.round()
	}
	return &policy.Limit{RequestsPerUnit: 10, Unit: policy.Minute, UnitMultiplier: 1, Algorithm: limiter.FixedWindow}, nil
}

// TestPulledCheckDecidesOnlyOnACounterStillHere: the previous owner of a
// key, asked to decide a pulled check, holds its counter when it looks,
// and a round of hand-off takes it out before the check is decided: the
// check decides nothing (Pulled says the counter is not here), and the
// counter reaches the new owner with its hits, nothing left behind. Before,
// the check was decided on a counter started afresh, which a later round
// handed over too, and the new owner kept the more charged of the two: a
// scale run's key admitted 301 on 300 so.
func TestPulledCheckDecidesOnlyOnACounterStillHere(t *testing.T) {
	var svcs []*Service
	p := &roundBetweenLookAndDecision{round: func() {
		if n := svcs[1].HandOff(t.Context()); n != 1 {
			t.Errorf("the round handed off %d counters, want 1", n)
		}
	}}
	c, svcs := newFakeClusterWith(2, func(int) Config { return Config{Policies: p} })
	key := c.keyOwnedBy(0)
	item := &pb.CheckItem{Name: "api", Key: key, Policy: "p"}
	resolved, err := svcs[1].withPolicy(item)
	if err != nil {
		t.Fatal(err)
	}
	r, err := checks.Request(resolved, t0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // node-1, the key's previous owner, holds its counter: 3 hits
		svcs[1].store.Decide(&r)
	}
	p.calls = 0

	resps, err := svcs[1].Owner().Pulled(t.Context(), []*pb.CheckRequest{{Requests: []*pb.CheckItem{item}}})
	if !errors.Is(err, peer.ErrNotHere) {
		t.Fatalf("a pull whose counter left before its decision: %v, %v; want peer.ErrNotHere", resps, err)
	}
	if svcs[1].store.Holds(&r) {
		t.Error("the previous owner holds a counter for the key after the pull: it started one afresh")
	}
	if got := check(t, svcs[0], item); got.GetRemaining() != 6 {
		t.Errorf("the new owner's next check: %v, want 6 left (3 hits handed over, and this one)", got)
	}
}
