package replica

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/limiter"
)

// TestReservationsFollowTheirReplica: a reservation made at a key's owner
// reaches its heir with the counter, and so does its settle; when the
// owner is lost, the heir promotes the replica and holds both: the open
// reservation is settled there, once, and a retry of the settle made at
// the owner is replayed.
func TestReservationsFollowTheirReplica(t *testing.T) {
	c := newCluster(3, DefaultInterval)
	key := c.keysOf(0, 1)[0]
	heir := c.heirOf(key)
	owner := c.nodes[0].store
	reserve := func(hits int64) limiter.ReservationID {
		t.Helper()
		r := limiter.Request{Name: "api", Key: key, Algorithm: limiter.TokenBucket, Limit: limit, Hits: hits, Now: t0}
		_, id, err := owner.Reserve(&r, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	settle := func(s *limiter.Store, id limiter.ReservationID, cost int64) (limiter.Settled, error) {
		return s.Settle(&limiter.Settlement{ID: id, Name: "api", Key: key, Cost: cost, Now: t0})
	}
	open, first := reserve(3), reserve(2)
	c.nodes[0].Replicate(t.Context())
	if held := c.nodes[heir].replicas.Reservations(); held != 2 {
		t.Fatalf("the heir's replicas hold %d reservations, want 2", held)
	}
	if _, err := settle(owner, first, 4); err != nil { // 2 forced
		t.Fatal(err)
	}
	c.nodes[0].Replicate(t.Context())

	without := c.ring.Without("n0")
	c.members[heir].set(without)
	c.nodes[heir].Promote(without)
	s := c.nodes[heir].store
	if s.Reservations() != 2 || c.nodes[heir].replicas.Reservations() != 0 {
		t.Fatalf("after promotion the heir holds %d reservations, its replicas %d; want 2 and 0", s.Reservations(), c.nodes[heir].replicas.Reservations())
	}
	if got, err := settle(s, first, 4); err != nil || !got.Replayed || got.Forced != 2 {
		t.Errorf("retry at the heir: %+v, %v; want replayed, 2 forced", got, err)
	}
	if got, err := settle(s, open, 0); err != nil || got.GivenBack != 3 {
		t.Errorf("settle of the open one at the heir: %+v, %v; want 3 given back", got, err)
	}
	if got, want := remaining(s, key), limit.Count-4; got != want {
		t.Errorf("the heir's counter: %d remaining, want %d (4 charged once)", got, want)
	}
}
