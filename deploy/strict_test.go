package deploy

import (
	"strings"
	"testing"
)

// TestChartStrictMode checks the strict values: off by default (no
// --strict-* flag); with strict.quorum, --strict-quorum, and
// --strict-fence only when strict.fence is set too.
func TestChartStrictMode(t *testing.T) {
	for _, tc := range []struct {
		name          string
		sets          []string
		quorum, fence string // "" : the flag is not passed
	}{
		{"off by default", nil, "", ""},
		{"quorum", []string{"strict.quorum=2"}, "2", ""},
		{"quorum and fence", []string{"replicaCount=5", "strict.quorum=3", "strict.fence=20s"}, "3", "20s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := flags(t, render(t, tc.sets...).container(t))
			q, hasQ := f["strict-quorum"]
			fence, hasFence := f["strict-fence"]
			if q != tc.quorum || hasQ != (tc.quorum != "") || fence != tc.fence || hasFence != (tc.fence != "") {
				t.Errorf("--strict-quorum=%q (passed %v), --strict-fence=%q (passed %v); want %q, %q (passed only if not empty)",
					q, hasQ, fence, hasFence, tc.quorum, tc.fence)
			}
		})
	}
}

// TestChartStrictModeRefusesAQuorumItCannotKeep: the chart refuses a
// quorum that is not a majority of the pods (two sides of a split could
// both decide), one that a rolling update (one pod down) or an eviction
// the PodDisruptionBudget allows would lose (every key refused
// meanwhile), and a fence without strict mode.
func TestChartStrictModeRefusesAQuorumItCannotKeep(t *testing.T) {
	for _, tc := range []struct {
		sets []string
		want string
	}{
		{[]string{"strict.quorum=1"}, "strict.quorum (1) must be a majority of replicaCount (3), at least 2"},
		{[]string{"replicaCount=6", "strict.quorum=3"}, "must be a majority of replicaCount (6), at least 4"},
		{[]string{"strict.quorum=3"}, "strict.quorum (3) must be below replicaCount (3)"},
		{[]string{"replicaCount=2", "strict.quorum=2"}, "must be below replicaCount (2)"},
		{[]string{"replicaCount=5", "strict.quorum=3", "podDisruptionBudget.maxUnavailable=3"}, "podDisruptionBudget.maxUnavailable (3) must leave strict.quorum (3)"},
		{[]string{"strict.quorum=-1"}, "quorum"},
		{[]string{"strict.quorum=2", "strict.fence=soon"}, "fence"},
		{[]string{"strict.fence=20s"}, "strict.fence: set only with strict.quorum"},
	} {
		t.Run(strings.Join(tc.sets, ","), func(t *testing.T) {
			out, err := helmTemplate(tc.sets...)
			if err == nil {
				t.Fatalf("helm template accepted %v:\n%s", tc.sets, out)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
	// A disruption budget in percent is left to the operator.
	render(t, "replicaCount=5", "strict.quorum=3", "podDisruptionBudget.maxUnavailable=40%")
}
