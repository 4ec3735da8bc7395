#!/usr/bin/env bash
# Measures server CPU per check before and after a change
# (docs/bench/cpu.md), in one run, interleaved so that the machine's
# noise falls on both alike: rlnode built at BEFORE (default ea75947, the
# commit before the client's batches of 16 went without waiting; 124c130
# is the one before the streams and the hand-written codec) and at HEAD,
# each driving its own nodes with its own `rlnode bench` (the Go client is
# part of the change), ROUNDS rounds (default 2) of
#   1. one node, the Go client's Allow from 50 goroutines;
#   2. one node, the same from 17 goroutines (what each of three nodes
#      gets from 50 routed callers);
#   3. three nodes, 10 checks a request, all into one node;
#   4. three nodes, the Go client's Allow, all into one node;
#   5. three nodes, the Go client's Allow, routed to each key's owner;
#   6. the same from 150 goroutines (50 a node, as in 1);
# DURATION (default 10s) each, 10,000 uniform keys, every check admitted.
# A line per run: checks/s, p50, p99, the nodes' CPU per check (sum and
# per node) and the load average as the run ended.
# Uses 127.0.0.1:2x080-2x082 and :2{7,8,9}946.
set -euo pipefail
cd "$(dirname "$0")/.."
before=${BEFORE:-ea75947}
rounds=${ROUNDS:-2}
duration=${DURATION:-10s}
old=$(mktemp -d)
bin=$(mktemp -d)
nodes=()
stop_nodes() {
	[ ${#nodes[@]} -gt 0 ] && kill "${nodes[@]}" 2>/dev/null && wait "${nodes[@]}" 2>/dev/null || true
	nodes=()
}
trap 'stop_nodes; git worktree remove --force "$old" >/dev/null 2>&1 || true; rm -rf "$bin"' EXIT
git worktree add -q --detach "$old" "$before"
(cd "$old" && go build -o "$bin/rlnode-before" ./cmd/rlnode)
go build -o "$bin/rlnode-after" ./cmd/rlnode
echo "== $(date -u +%FT%TZ) $(go version) $(nproc) cores; before = $before, after = $(git rev-parse --short HEAD)"

# start_nodes SIDE N starts N nodes of SIDE's build and waits until they
# are ready and have seen each other.
start_nodes() {
	local side=$1 n=$2
	for i in $(seq 0 $((n - 1))); do
		local join=()
		[ "$i" -gt 0 ] && join=(--join 127.0.0.1:27946)
		"$bin/rlnode-$side" --http-addr 127.0.0.1:2${i}080 --grpc-addr 127.0.0.1:2${i}081 --peer-addr 127.0.0.1:2${i}082 \
			--gossip-addr 127.0.0.1:2$((7 + i))946 --node-name bench-$i --log-level error "${join[@]}" 2>/dev/null &
		nodes+=($!)
	done
	for i in $(seq 0 $((n - 1))); do
		for _ in $(seq 100); do curl -sf 127.0.0.1:2${i}080/readyz >/dev/null && break; sleep 0.1; done
	done
	sleep 2 # let the ring converge on every node
}

# run SIDE ROUND NAME ARGS... runs one load and prints its line.
run() {
	local side=$1 round=$2 name=$3
	shift 3
	"$bin/rlnode-$side" bench --concurrency 50 --count 100000000 --duration "$duration" --json "$@" 2>/dev/null |
		awk -v side="$side" -v round="$round" -v name="$name" -v load="$(cut -d' ' -f1 /proc/loadavg)" '
		function num(key,   v) { if (!match($0, "\"" key "\":[0-9.e+-]+")) return -1
			v = substr($0, RSTART, RLENGTH); sub(/^[^:]*:/, "", v); return v + 0 }
		{
			answered = num("answered"); split($0, parts, "\"cpu_seconds\":"); per = ""
			for (i = 2; i in parts; i++) { split(parts[i], v, /[,}]/); per = per (per ? " + " : "") sprintf("%.2f", v[1] * 1e6 / answered) }
			printf "%-6s %d %-22s %8.0f checks/s  p50 %5.2f ms  p99 %6.2f ms  cpu/check %5.2f us (%s)  errors %d  load %s\n",
				side, round, name, num("checks_per_sec"), num("p50") / 1000, num("p99") / 1000, num("cpu_us_per_check"), per, num("errors"), load
		}'
}

m3=127.0.0.1:20080,127.0.0.1:21080,127.0.0.1:22080
for round in $(seq "$rounds"); do
	for side in before after; do
		start_nodes $side 1
		run $side "$round" "1 node, client" --addr 127.0.0.1:20081 --client --metrics 127.0.0.1:20080
		run $side "$round" "1 node, client, 17" --addr 127.0.0.1:20081 --client --metrics 127.0.0.1:20080 --concurrency 17
		stop_nodes
		start_nodes $side 3
		run $side "$round" "3 nodes, 10 a request" --addr 127.0.0.1:20081 --items 10 --metrics $m3
		run $side "$round" "3 nodes, client" --addr 127.0.0.1:20081 --client --metrics $m3
		run $side "$round" "3 nodes, client routed" --addrs 127.0.0.1:20081,127.0.0.1:21081,127.0.0.1:22081 --client --route --metrics $m3
		run $side "$round" "3 nodes, routed, 150" --addrs 127.0.0.1:20081,127.0.0.1:21081,127.0.0.1:22081 --client --route --metrics $m3 --concurrency 150
		stop_nodes
	done
done
