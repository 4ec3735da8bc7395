package clients

import (
	"container/heap"
	"sync"
	"sync/atomic"
	"time"
)

// Quota bounds what each client holds of a table at once: at most Max
// entries a client, each held from its Claim until it is returned or its
// Keep time passes. It is safe for concurrent use; its memory is one
// count a client that holds something and one expiry an entry kept.
type Quota struct {
	max     int
	refused atomic.Int64
	mu      sync.Mutex
	held    map[ID]int
	expiry  expiries
}

// NewQuota returns a Quota of most entries a client (at least 1).
func NewQuota(most int) *Quota {
	return &Quota{max: max(most, 1), held: map[ID]int{}}
}

// Max returns the most entries a client may hold.
func (q *Quota) Max() int { return q.max }

// Claim holds one more entry for id at now, if id holds fewer than Max,
// and reports whether it did. The caller then either Returns it or Keeps
// it until its expiry.
func (q *Quota) Claim(id ID, now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expire(now.UnixNano())
	if q.held[id] >= q.max {
		q.refused.Add(1)
		return false
	}
	q.held[id]++
	return true
}

// Refused returns how many claims were refused, since the Quota was made.
func (q *Quota) Refused() int64 { return q.refused.Load() }

// Return gives back an entry id claimed and did not use.
func (q *Quota) Return(id ID) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.release(id)
}

// Keep holds an entry id claimed until until.
func (q *Quota) Keep(id ID, until time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	heap.Push(&q.expiry, expiring{until.UnixNano(), id})
}

// Held returns the entries id holds at now.
func (q *Quota) Held(id ID, now time.Time) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expire(now.UnixNano())
	return q.held[id]
}

func (q *Quota) release(id ID) {
	if n := q.held[id]; n > 1 {
		q.held[id] = n - 1
	} else {
		delete(q.held, id)
	}
}

// expire releases the entries kept until now or before. q.mu is held.
func (q *Quota) expire(now int64) {
	for len(q.expiry) > 0 && q.expiry[0].at <= now {
		q.release(heap.Pop(&q.expiry).(expiring).id)
	}
}

type expiring struct {
	at int64
	id ID
}

// expiries orders kept entries by expiry, soonest first.
type expiries []expiring

func (h expiries) Len() int           { return len(h) }
func (h expiries) Less(i, j int) bool { return h[i].at < h[j].at }
func (h expiries) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiries) Push(x any)        { *h = append(*h, x.(expiring)) }
func (h *expiries) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
