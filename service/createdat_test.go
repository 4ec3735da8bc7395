package service

import (
	"fmt"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
)

// TestFutureCreatedAtGainsNothing: a spent counter stays spent for a check
// whose created_at_ms lies ahead of the node's clock, up to the clock-skew
// bound (default 10 minutes): the check is decided at the node's now, so
// it regains none of what the difference would refill, and the checks
// after it, at the node's now, are not held at that later time either.
// Asked through the owner and forwarded by another node alike, for every
// algorithm. (Issue 24: 9 minutes ahead, each of these was admitted once.)
func TestFutureCreatedAtGainsNothing(t *testing.T) {
	ahead := t0.Add(9*time.Minute + 59*time.Second).UnixMilli()
	c, svcs := newFakeCluster(2)
	for _, alg := range []pb.Algorithm{pb.Algorithm_TOKEN_BUCKET, pb.Algorithm_GCRA, pb.Algorithm_LEAKY_BUCKET,
		pb.Algorithm_FIXED_WINDOW, pb.Algorithm_SLIDING_WINDOW, pb.Algorithm_SLIDING_LOG} {
		for via, s := range svcs {
			t.Run(fmt.Sprint(alg, "/via node-", via), func(t *testing.T) {
				key := keyOf(c, "node-1", fmt.Sprint("future-", alg, "-", via))
				item := &pb.CheckItem{Name: "api", Key: key, Limit: 10, DurationMs: 60_000, Algorithm: alg}
				for i := range 10 {
					if r := check(t, s, item); r.Status != pb.Status_UNDER_LIMIT {
						t.Fatalf("spending hit %d: %v", i, r)
					}
				}
				future := &pb.CheckItem{Name: "api", Key: key, Limit: 10, DurationMs: 60_000, Algorithm: alg, CreatedAtMs: ahead}
				for i := range 3 {
					if r := check(t, s, future); r.Status != pb.Status_OVER_LIMIT {
						t.Errorf("check %d with created_at_ms 9m59s ahead on a spent counter: %v, want OVER_LIMIT", i, r)
					}
				}
				if r := check(t, s, item); r.Status != pb.Status_OVER_LIMIT || r.Remaining != 0 {
					t.Errorf("check at the node's now after them: %v, want OVER_LIMIT", r)
				}
			})
		}
	}
}

// keyOf returns a key beginning with prefix that c's ring gives to the
// member named owner.
func keyOf(c *fakeCluster, owner, prefix string) string {
	for i := 0; ; i++ {
		key := fmt.Sprint(prefix, "-", i)
		if o, _ := c.ring.Owner(key); o.Name == owner {
			return key
		}
	}
}

// TestFutureCountersGainNothing: a counter spent at t0 that arrives
// evaluated 9m59s ahead of the receiver's clock (within the skew bound),
// handed off by the key's previous owner or replicated by its owner and
// promoted once that owner has left, is taken as evaluated now: the key
// stays spent, where read at the counter's own later time it would have
// refilled. (This held on main too: checks.Intake clamps a received
// counter's time.)
func TestFutureCountersGainNothing(t *testing.T) {
	minute := algorithms.Limit{Count: 10, Period: time.Minute}
	spentAhead := func(key string) []*peerpb.CounterState {
		return []*peerpb.CounterState{{Counter: record(limiter.TokenBucket, "api", key, minute,
			t0.Add(9*time.Minute+59*time.Second).UnixNano(), encoded(&algorithms.TokenBucket{Full: t0.Add(time.Minute).UnixNano()}))}}
	}
	item := func(key string) *pb.CheckItem {
		return &pb.CheckItem{Name: "api", Key: key, Limit: 10, DurationMs: 60_000}
	}
	t.Run("HandOff", func(t *testing.T) {
		c, svcs := newFakeCluster(2)
		client := servePeer(t, svcs[0], nil)
		key := c.keyOwnedBy(0)
		if accepted, refused := counterRPCs["HandOff"](t, client, "node-1", spentAhead(key)); accepted != 1 || len(refused) != 0 {
			t.Fatalf("accepted %d, refused %v", accepted, refused)
		}
		if r := check(t, svcs[0], item(key)); r.Status != pb.Status_OVER_LIMIT {
			t.Errorf("a spent counter handed off 9m59s ahead: %v, want OVER_LIMIT", r)
		}
	})
	t.Run("Replicate", func(t *testing.T) {
		c, svcs := newFakeCluster(2)
		client := servePeer(t, svcs[0], nil)
		key := c.keyOwnedBy(1)
		if accepted, refused := counterRPCs["Replicate"](t, client, "node-1", spentAhead(key)); accepted != 1 || len(refused) != 0 {
			t.Fatalf("accepted %d, refused %v", accepted, refused)
		}
		c.ring = c.ring.Without("node-1")
		if r := check(t, svcs[0], item(key)); r.Status != pb.Status_OVER_LIMIT {
			t.Errorf("a spent replica 9m59s ahead, promoted as its owner left: %v, want OVER_LIMIT", r)
		}
	})
}
