//go:build chaos

package e2e

import (
	"strings"
	"testing"
)

// strictArgs turns strict mode on (docs/strict.md): a node of the five
// decides keys only while it sees three members, with the default fence.
var strictArgs = []string{"--strict-quorum", "3"}

// The strict runs of the kill -9, pause and partition scenarios: the same
// faults and bounds on answers, on nodes in strict mode, and no key admits
// more than its exact limit. Each logs what strict mode cost: the checks
// refused from escrow, and how far under the exact limit the run admitted.

func TestChaosStrictKillNine(t *testing.T)  { chaosKillNine(t, strictArgs...).strict(t) }
func TestChaosStrictPause(t *testing.T)     { chaosPause(t, strictArgs...).strict(t) }
func TestChaosStrictPartition(t *testing.T) { chaosPartition(t, strictArgs...).strict(t) }

// strict fails the test if any key admitted more than chaosLimit, and logs
// the run's cost in refusals.
func (l *chaosLoad) strict(t *testing.T) {
	t.Helper()
	over, escrow := 0, 0
	l.mu.Lock()
	for _, k := range l.byKey {
		over += max(0, k.admitted-chaosLimit)
	}
	l.mu.Unlock()
	for _, p := range l.phases {
		p.tally.mu.Lock()
		escrow += p.tally.decidedBy["escrow"]
		p.tally.mu.Unlock()
	}
	got, exact := l.admitted()
	t.Logf("strict mode: %d over the exact limit summed over keys (bound 0); %d checks refused from escrow; admitted %d of an exact %d (%+.2f%%)",
		over, escrow, got, exact, 100*float64(got-exact)/float64(max(exact, 1)))
	if over != 0 {
		errorf(t, "strict mode admitted %d over the exact limit, want 0:\n\t%s", over, strings.Join(l.over(chaosLimit), "\n\t"))
	}
}
