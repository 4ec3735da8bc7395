//go:build chaos

package e2e

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// sumKeys are keys checked a few hits at a time on every side of a
// partition, well below their limit, so that after the heal their
// owner's counter shows whether it counts what every side admitted (the
// sum) or only the more charged side's counter (docs/partitions.md,
// "Stand-ins: the sum of the sides").
const (
	sumKeys  = 20
	sumLimit = 100
)

// sumProbe sends the partition's sum keys their hits and checks their
// counters after the heal.
type sumProbe struct {
	id       string
	start    time.Time
	mu       sync.Mutex
	admitted [sumKeys]int
	wg       sync.WaitGroup
}

func (p *sumProbe) item(k int, hits int64) *pb.CheckItem {
	return &pb.CheckItem{Name: "chaos-sum", Key: fmt.Sprintf("%s:sum:%d", p.id, k), Limit: sumLimit,
		DurationMs: hour, Algorithm: pb.Algorithm_SLIDING_LOG, Hits: proto.Int64(hits)}
}

// during sends, from when it is called, two rounds of hits on every side:
// after 1 s (while nodes fail over and fall back to shares) and after 12 s
// (once every ring has dropped the other sides), two checks of one hit per
// key through each of sides, one node of each.
func (p *sumProbe) during(sides []*chaosNode) {
	p.start = time.Now()
	p.wg.Go(func() {
		for _, at := range []time.Duration{time.Second, 12 * time.Second} {
			time.Sleep(at - p.since())
			for _, n := range sides {
				for k := range sumKeys {
					for range 2 {
						if r, err := check(n.node, p.item(k, 1)); err == nil && r.Status == pb.Status_UNDER_LIMIT {
							p.mu.Lock()
							p.admitted[k]++
							p.mu.Unlock()
						}
					}
				}
			}
		}
	})
}

// verify waits for the probe's hits, then, for up to 20 s, for every sum
// key's counter to count all it admitted, peeking through via: a key
// whose counter counts fewer fails the test (the heal forgot a side's
// admissions). It returns how many keys count exactly their sum, and
// what the keys admitted in all.
func (p *sumProbe) verify(t *testing.T, via *chaosNode) (exact, admitted int) {
	t.Helper()
	p.wg.Wait()
	left := func(k int) (int64, error) {
		r, err := check(via.node, p.item(k, 0))
		return r.GetRemaining(), err
	}
	for k := range sumKeys {
		admitted += p.admitted[k]
	}
	end := time.Now().Add(20 * time.Second)
	for k := range sumKeys {
		want := int64(sumLimit - p.admitted[k])
		got, err := left(k)
		for (err != nil || got > want) && time.Now().Before(end) {
			time.Sleep(200 * time.Millisecond) // polling the heal's give-back, bounded by end
			got, err = left(k)
		}
		switch {
		case err != nil:
			errorf(t, "sum key %d: %v", k, err)
		case got > want:
			errorf(t, "sum key %d admitted %d across the sides, but its counter has %d of %d left after the heal, want at most %d: the heal forgot admissions",
				k, p.admitted[k], got, sumLimit, want)
		case got == want:
			exact++
		default:
			t.Logf("sum key %d: %d left, %d fewer than its sum leaves (charged twice: the safe side)", k, got, want-got)
		}
	}
	return exact, admitted
}

func (p *sumProbe) since() time.Duration { return time.Since(p.start) }
