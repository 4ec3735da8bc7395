#!/usr/bin/env bash
# The leave and join tests under load (make test-loaded): two busy loops
# take the machine's cores while the tests of a node leaving, joining,
# crashing and coming back run COUNT times each, since a hand-off that is
# exact on an idle machine may not be on a busy one (a rolling update runs
# while the cluster is busy). The loops are ended by their PIDs however
# the tests end, and each is bounded in time besides.
set -euo pipefail
cd "$(dirname "$0")/.."
count=${COUNT:-20}

# cmd/rlnode: nodes in the test process; e2e: rlnode processes.
cmd_tests='^(TestRoutingClientExactWhileANodeLeaves|TestRoutingClientFollowsTheRing|TestCountersSurviveScaleOutAndShutdown)$'
e2e_tests='^(TestScaleOutKeepsCounters|TestSIGTERMKeepsCounters|TestCrashedNodeRejoinsUnderItsName|TestCrashedOwnerReturnsToItsCounters)$'

# Build first, without the loops: the build is not what is under test.
go test -race -count=1 -run '^$' ./cmd/rlnode/ ./e2e/ >/dev/null

loops=()
stop() { kill "${loops[@]}" 2>/dev/null || true; }
trap stop EXIT
for _ in 1 2; do
	timeout 1h sh -c 'while :; do :; done' &
	loops+=($!)
done
echo "== two busy loops (PIDs ${loops[*]}); each test $count times"
go test -race -count="$count" -timeout 60m -run "$cmd_tests" ./cmd/rlnode/
go test -race -count="$count" -timeout 60m -run "$e2e_tests" ./e2e/
