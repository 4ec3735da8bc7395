package global

import (
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/ring"
)

// tenure is the rings this node has seen lately, so that it can tell a
// key it has owned for a while from one it has just come to own. A new
// rate share (shares.go) must wait a lease time-to-live before it is
// raised above what its stream claims only when another node, or this
// node before a restart, may have lent shares of the key that are still
// in force at the Envoys; a key this node has owned in every ring since
// then has no such shares, and its new buckets are lent a share at once.
//
// Rings are observed every sync round (Broadcast) and at each share
// report, so a change is seen at most a round late; the rings seen
// before the first observation (this process's start) are unknown, so a
// key is never held longer than this node has been watching.
type tenure struct {
	mu   sync.Mutex
	seen []seenRing // oldest first; the last is the ring in force
}

type seenRing struct {
	ring  *ring.Ring
	since time.Time
}

// observe records r as the ring in force from now if it is not already,
// and forgets the rings that ended before now-keep.
func (t *tenure) observe(r *ring.Ring, now time.Time, keep time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.observeLocked(r, now, keep)
}

func (t *tenure) observeLocked(r *ring.Ring, now time.Time, keep time.Duration) {
	if len(t.seen) == 0 || t.seen[len(t.seen)-1].ring != r {
		t.seen = append(t.seen, seenRing{ring: r, since: now})
	}
	for len(t.seen) > 1 && !t.seen[1].since.After(now.Add(-keep)) {
		t.seen[0] = seenRing{}
		t.seen = t.seen[1:]
	}
}

// held reports whether self owned key in every ring in force since
// now-d, as far as this node has seen them (observing r first).
func (t *tenure) held(r *ring.Ring, self, key string, now time.Time, d time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.observeLocked(r, now, d)
	if t.seen[0].since.After(now.Add(-d)) {
		return false // watched for less than d
	}
	for _, s := range t.seen {
		if owner, _ := s.ring.Owner(key); owner.Name != self {
			return false
		}
	}
	return true
}
