package e2e

import (
	"context"
	"fmt"
	"syscall"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/ring"
)

// Reservations in these tests are of a sliding log of 100 hits an hour,
// which refills nothing while a test runs, so that every count is exact:
// open holds 30 hits, and first holds 20 and is settled for 25 (5 forced)
// before the cluster is hurt; 45 remain.
const (
	reserveLimit = 100
	openHits     = 30
	firstHits    = 20
	firstCost    = 25
)

// reserveItem is the check of the reservations' key, for hits.
func reserveItem(key string, hits int64) *pb.CheckItem {
	return &pb.CheckItem{Name: "tokens", Key: key, Algorithm: pb.Algorithm_SLIDING_LOG, Limit: reserveLimit, DurationMs: hour, Hits: &hits}
}

// settle sends a settle of id for key with cost to n over gRPC, as any
// client can, to any node.
func settle(t *testing.T, n *node, id, key string, cost int64) (*pb.SettleResponse, error) {
	t.Helper()
	conn, err := grpc.NewClient(n.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	return pb.NewRateLimiterClient(conn).Settle(ctx, &pb.SettleRequest{ReservationId: id, Name: "tokens", Key: key, Cost: &cost})
}

// reservations makes the two reservations of key through n (see the
// constants above) and settles first; it returns their ids.
func reservations(t *testing.T, n *node, key string) (open, first string) {
	t.Helper()
	ttl := int64(hour)
	for _, r := range []struct {
		id   *string
		hits int64
	}{{&open, openHits}, {&first, firstHits}} {
		item := reserveItem(key, r.hits)
		item.ReserveTtlMs = &ttl
		res, err := check(n, item)
		if err != nil || res.ReservationId == "" {
			t.Fatalf("reserve %d of %s: %v, %v", r.hits, key, res, err)
		}
		*r.id = res.ReservationId
	}
	got, err := settle(t, n, first, key, firstCost)
	if err != nil || got.Forced != firstCost-firstHits || got.State.Remaining != reserveLimit-openHits-firstCost {
		t.Fatalf("settle of the first for %d: %v, %v", firstCost, got, err)
	}
	return open, first
}

// settledOnce settles open for 10 through n, once the cluster answers
// (a settle may be refused UNAVAILABLE while the ring moves: it is sent
// again, as a client would), retries first's settle, and checks that
// each was charged once: 20 of open given back, first replayed, and 65
// remaining.
func settledOnce(t *testing.T, n *node, key, open, first string) {
	t.Helper()
	const cost = 10
	var got *pb.SettleResponse
	poll(t, keepTimeout, "the settle of the open reservation through "+n.name, func() (bool, string) {
		var err error
		got, err = settle(t, n, open, key, cost)
		if status.Code(err) == codes.Unavailable {
			return false, err.Error()
		}
		if err != nil {
			t.Fatalf("settle of the open reservation for %d: %v", cost, err)
		}
		return true, ""
	})
	want := int64(reserveLimit - firstCost - cost)
	if got.GivenBack != openHits-cost || got.Replayed || got.State.Remaining != want {
		t.Errorf("settle of the open reservation for %d: %v; want %d given back, %d remaining", cost, got, openHits-cost, want)
	}
	// A retry answers as the first settle did, state and all.
	again, err := settle(t, n, first, key, firstCost)
	if err != nil || !again.Replayed || again.Forced != firstCost-firstHits || again.State.Remaining != reserveLimit-openHits-firstCost {
		t.Errorf("retried settle of the first: %v, %v; want the first answer replayed, %d forced, %d remaining",
			again, err, firstCost-firstHits, reserveLimit-openHits-firstCost)
	}
	if again, err := settle(t, n, open, key, cost); err != nil || !again.Replayed || again.State.Remaining != want {
		t.Errorf("retried settle of the open one: %v, %v; want replayed, %d remaining", again, err, want)
	}
	if r, err := check(n, reserveItem(key, 0)); err != nil || r.Remaining != want {
		t.Errorf("the key after the settles: %v, %v; want %d remaining (each charged once)", r, err, want)
	}
}

// keyOwnedBy returns a key that the ring of c's running nodes gives to
// owner.
func keyOwnedBy(t *testing.T, c *testCluster, owner *node) string {
	t.Helper()
	var members []ring.Member
	for _, n := range c.running() {
		members = append(members, ring.Member{Name: n.name})
	}
	r := ring.New(members...)
	for i := range 10_000 {
		key := fmt.Sprint("tenant:", i)
		if o, _ := r.Owner(key); o.Name == owner.name {
			return key
		}
	}
	t.Fatalf("no key owned by %s", owner.name)
	return ""
}

// TestReservationSettledAtTheHeir: a reservation made through another
// node at a key's owner, which is then killed with SIGKILL, is settled at
// the key's heir, which becomes its owner, and charged exactly once; a
// reservation settled at the owner before it died answers a retry at the
// heir as it did, charging nothing more.
func TestReservationSettledAtTheHeir(t *testing.T) {
	c := startCluster(t, 3)
	victim := c.nodes[1]
	key := keyOwnedBy(t, c, victim)
	open, first := reservations(t, c.nodes[0], key)
	replicated(t, victim)

	kill(t, victim)
	c.waitConverged(2)
	settledOnce(t, c.nodes[2], key, open, first)
	if _, err := settle(t, c.nodes[0], "0123456789abcdef0123456789abcdef", key, 1); status.Code(err) != codes.NotFound {
		t.Errorf("a forged id after the failover: %v, want NOT_FOUND", err)
	}
}

// TestWholeClusterStopKeepsReservations: reservations survive all three
// nodes stopped at once with SIGTERM and started again from their
// snapshots: the open one is settled once, the settled one replayed.
func TestWholeClusterStopKeepsReservations(t *testing.T) {
	nodeArgs, _ := snapshotDirs(t)
	c := startClusterWith(t, 3, nodeArgs, "--snapshot-interval", "1h")
	key := keyOwnedBy(t, c, c.nodes[2])
	open, first := reservations(t, c.nodes[0], key)

	stopAllAtOnce(t, c, syscall.SIGTERM)
	restartAll(c)
	settledOnce(t, c.nodes[1], key, open, first)
	var loaded float64
	for _, n := range c.nodes {
		v, err := metric(n, "ringlimit_reservations")
		if err != nil {
			t.Fatal(err)
		}
		loaded += v
	}
	if loaded < 2 {
		t.Errorf("the nodes hold %v reservations after the restart, want at least the 2 made", loaded)
	}
}
