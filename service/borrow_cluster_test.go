package service

import (
	"fmt"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// borrowLoad is what a 3-node borrowing run admitted: by parent window,
// and, for each sync round, the hits admitted and how.
type borrowLoad struct {
	windows []int64 // hits admitted in each parent window
	rounds  []borrowRound
}

type borrowRound struct {
	window int
	// sofar is the hits admitted in the round's window up to the end of
	// the round; borrowed and guaranteed those of the round.
	sofar, borrowed, guaranteed int64
	// away is the guaranteed hits of the round whose key's owner is not
	// the parent's owner: the most the parent may learn of only at the
	// round's end (see docs/checks.md: Borrowing).
	away int64
}

// TestBorrowClusterBound runs three nodes and a parent of 40 a second,
// shared by three keys, one on each node, each guaranteed 10 a second and
// borrowing up to 50. Two keys are busy from the start and the third
// wakes up later; every key is offered 8 checks a round through every
// node, far more than the parent has, and a GLOBAL sync round follows
// each round. It checks the bound docs/checks.md states: the keys never
// borrow more than the parent holds, and at the end of each round in
// which a hit was borrowed, the hits admitted so far in the parent's
// window are at most the parent's limit plus the guaranteed hits of that
// round admitted away from the parent's owner. And every key gets its
// guarantee. It runs with the parent on each node: with FIXED_WINDOW over
// six seconds, a round every 100ms, and with every algorithm at one
// instant, where nothing refills (so the bound is over the whole run).
func TestBorrowClusterBound(t *testing.T) {
	for owner := range 3 {
		t.Run(fmt.Sprint("FIXED_WINDOW over time, parent on node-", owner), func(t *testing.T) {
			testBorrowClusterBound(t, pb.Algorithm_FIXED_WINDOW, owner, 100*time.Millisecond, 60, 20)
		})
		for _, alg := range publicAlgorithms {
			t.Run(fmt.Sprint(alg, " at one instant, parent on node-", owner), func(t *testing.T) {
				testBorrowClusterBound(t, alg, owner, 0, 10, 4)
			})
		}
	}
}

// testBorrowClusterBound is TestBorrowClusterBound with algorithm alg,
// the parent on node parentOn, rounds of step (0: time stands still),
// the third key waking at round wake.
func testBorrowClusterBound(t *testing.T, alg pb.Algorithm, parentOn int, step time.Duration, rounds, wake int) {
	const (
		parentLimit = 40
		window      = time.Second
	)
	now := t0
	c, svcs := newFakeClusterWith(3, func(int) Config { return Config{Now: clockAt(&now)} })
	parentKey := ""
	for i := 0; parentKey == ""; i++ {
		if owner, _ := c.ring.Owner(fmt.Sprint("all-", i)); owner.Name == fmt.Sprint("node-", parentOn) {
			parentKey = fmt.Sprint("all-", i)
		}
	}
	keys := []string{c.keyOwnedBy(0), c.keyOwnedBy(1), c.keyOwnedBy(2)}
	items := make([]*pb.CheckItem, len(keys))
	for k, key := range keys {
		items[k] = borrower(alg, key, 10, 50, parentLimit, window, 0)
		items[k].Parent.Key = parentKey
	}
	var load borrowLoad
	perKey := make([][]int64, len(keys)) // admitted by window
	for r := range rounds {
		now = t0.Add(time.Duration(r) * step)
		w := int(now.Sub(t0) / window)
		if w == len(load.windows) {
			load.windows = append(load.windows, 0)
			for k := range perKey {
				perKey[k] = append(perKey[k], 0)
			}
		}
		br := borrowRound{window: w}
		for i := range 8 {
			for k, item := range items {
				if k == 2 && r < wake {
					continue // the third key sleeps
				}
				res := check(t, svcs[(i+k)%3], item)
				if res.Status != pb.Status_UNDER_LIMIT {
					continue
				}
				load.windows[w]++
				perKey[k][w]++
				switch {
				case res.Borrowed:
					br.borrowed++
				case k != parentOn:
					br.guaranteed++
					br.away++
				default:
					br.guaranteed++
				}
			}
		}
		br.sofar = load.windows[w]
		load.rounds = append(load.rounds, br)
		syncRound(svcs)
	}
	t.Logf("admitted by window %v, by key and window %v", load.windows, perKey)

	borrowed := make([]int64, len(load.windows))
	for r, br := range load.rounds {
		borrowed[br.window] += br.borrowed
		if br.borrowed > 0 && br.sofar > parentLimit {
			t.Logf("round %d (window %d): %d admitted in the window so far, %d over the parent, with %d borrowed and %d guaranteed away from its owner this round",
				r, br.window, br.sofar, br.sofar-parentLimit, br.borrowed, br.away)
		}
		if br.borrowed > 0 && br.sofar > parentLimit+br.away {
			t.Errorf("round %d (window %d): %d admitted in the window so far, with %d borrowed this round: more than the parent's %d plus the %d guaranteed away from its owner this round",
				r, br.window, br.sofar, br.borrowed, parentLimit, br.away)
		}
	}
	for w, b := range borrowed {
		if b > parentLimit {
			t.Errorf("window %d: %d borrowed, more than the parent's %d", w, b, parentLimit)
		}
		if b == 0 {
			t.Errorf("window %d: nothing borrowed while the parent had room", w)
		}
	}
	woke := int(time.Duration(wake) * step / window) // the third key's first window
	for w := range load.windows {
		for k := range keys {
			if perKey[k][w] < 10 && (k < 2 || w >= woke) {
				t.Errorf("window %d: key %d admitted %d, below its guarantee of 10", w, k, perKey[k][w])
			}
		}
	}
}
