#!/usr/bin/env bash
# Measures GLOBAL checks per second before and after GLOBAL moved into its
# own, sharded package, in one run: the same BenchmarkGlobal (service) at
# the commit that added it, when one mutex guarded all GLOBAL state and
# was held across whole sync rounds, and at HEAD, interleaved so that the
# machine's noise falls on both alike.
set -euo pipefail
cd "$(dirname "$0")/.."
before=${BEFORE:-f345620} # service: BenchmarkGlobal, on the single-mutex GLOBAL
old=$(mktemp -d)
trap 'git worktree remove --force "$old" >/dev/null 2>&1 || true' EXIT
git worktree add -q --detach "$old" "$before"
echo "== $(date -u +%FT%TZ) $(go version) $(nproc) cores; before = $before, after = $(git rev-parse --short HEAD)"
for round in 1 2 3; do
	for side in before after; do
		dir=.; [ $side = before ] && dir=$old
		echo "-- round $round: $side"
		(cd "$dir" && go test -run '^$' -bench 'Global$' -benchtime 2s ./service) | grep -E '^Benchmark' | sed "s/^/$side /"
	done
done
