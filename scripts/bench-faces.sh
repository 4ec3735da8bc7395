#!/usr/bin/env bash
# Measures the HTTP/JSON face against the gRPC face before and after the
# hand-written JSON path, in one run, interleaved so that the machine's
# noise falls on both alike:
#   1. BenchmarkFaces (api) at the commit that added it, on encoding/json,
#      and at HEAD: 3 rounds each;
#   2. rlnode bench (64 clients, 100 checks a request, 5 s) against one
#      rlnode built at each commit, with the CPU seconds the node and the
#      client each spent: 2 rounds each.
# Uses 127.0.0.1:28180-28182 and :27946.
set -euo pipefail
cd "$(dirname "$0")/.."
before=${BEFORE:-5c8aaa4} # api: BenchmarkFaces, on the encoding/json path
old=$(mktemp -d)
bin=$(mktemp -d)
node=
trap '[ -n "$node" ] && kill $node 2>/dev/null; git worktree remove --force "$old" >/dev/null 2>&1 || true; rm -rf "$bin"' EXIT
git worktree add -q --detach "$old" "$before"
echo "== $(date -u +%FT%TZ) $(go version) $(nproc) cores; before = $before, after = $(git rev-parse --short HEAD)"
(cd "$old" && go test -c -o "$bin/before.test" ./api && go build -o "$bin/rlnode-before" ./cmd/rlnode)
go test -c -o "$bin/after.test" ./api
go build -o "$bin/rlnode-after" ./cmd/rlnode

echo "== BenchmarkFaces"
for round in 1 2 3; do
	for side in before after; do
		(cd api && "$bin/$side.test" -test.run '^$' -test.bench Faces -test.benchmem -test.benchtime 2s) |
			grep -E '^Benchmark' | sed "s/^/$side $round /"
	done
done

echo "== rlnode bench, 100 checks a request; CPU seconds of node and client"
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }
for round in 1 2; do
	for side in before after; do
		"$bin/rlnode-$side" --http-addr 127.0.0.1:28180 --grpc-addr 127.0.0.1:28181 --peer-addr 127.0.0.1:28182 \
			--gossip-addr 127.0.0.1:27946 --node-name bench-faces --log-level error 2>/dev/null &
		node=$!
		for _ in $(seq 50); do curl -sf 127.0.0.1:28180/readyz >/dev/null && break; sleep 0.1; done
		for proto in grpc http; do
			port=28181; [ $proto = http ] && port=28180
			start=$(cpu $node)
			out=$( { /usr/bin/time -f 'client_cpu %U %S' "$bin/rlnode-after" bench --addr 127.0.0.1:$port \
				--protocol $proto --items 100 --concurrency 64 --duration 5s --count 200000 --json || true; } 2>&1)
			node_cpu=$(awk -v a="$start" -v b="$(cpu $node)" 'BEGIN { print b - a }')
			echo "$out" | awk -v side=$side -v round=$round -v proto=$proto -v node_cpu="$node_cpu" '
				/"checks":/ { match($0, /"checks":[0-9]+/); checks = substr($0, RSTART + 9, RLENGTH - 9)
					match($0, /"checks_per_sec":[0-9.]+/); cps = substr($0, RSTART + 17, RLENGTH - 17) }
				/^client_cpu/ { client = $2 + $3 }
				END { printf "%s %d %s: %.0f checks/s, node %.2f µs CPU a check, client %.2f µs\n",
					side, round, proto, cps, node_cpu * 1e6 / checks, client * 1e6 / checks }'
		done
		kill $node
		wait $node 2>/dev/null || true
		node=
	done
done
