#!/usr/bin/env bash
# Runs most benchmarks quoted in BENCHMARKS.md and its logs in docs/bench/,
# in one go, so that ratios compare figures measured in the same run on
# the same machine.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== $(date -u +%FT%TZ) $(go version) $(nproc) cores"
echo "== algorithms vs golang.org/x/time/rate"
go test -run '^$' -bench 'Take' -benchmem -count 5 ./algorithms  # noisy machine: take the median
echo "== counter store vs one sync.Mutex + map; memory per key"
go test -run '^$' -bench 'Store|MutexMap|MemoryPerKey' -benchmem ./limiter
echo "== snapshots: checks during a snapshot of 1,000,000 counters vs without; loading them"
go test -run '^$' -bench 'ChecksDuringSnapshot|Load' -benchtime 3x ./snapshot
echo "== a node's own work per request, no transport"
go test -run '^$' -bench 'Check' -benchmem -count 3 ./service
echo "== the hand-written protobuf codec vs protobuf, the messages of a check of ten items"
go test -run '^$' -bench 'Codec' -benchmem ./internal/wire
echo "== HTTP/JSON vs gRPC over loopback, one request at a time"
go test -run '^$' -bench 'Faces' -benchmem -count 3 ./api
echo "== Envoy's rate limit service vs the native check of the same work"
go test -run '^$' -bench 'RLSVersusNative' -benchmem -count 5 ./rls
echo "== a leased Allow in the application vs golang.org/x/time/rate"
go test -run '^$' -bench 'LeasedAllow' -benchtime 2s -count 3 ./client
echo "== a node's CPU per leased check vs the batching client's, 50 callers on a hot key (one rlnode process)"
go test -run '^$' -bench 'LeasedNodeCPU' -benchtime 3s -count 2 ./e2e
echo "== the RESP port (CL.THROTTLE) vs redis-server running the same GCRA in Lua, 1-64 callers, pipelined and not"
go test -run '^$' -bench 'RESPVersusRedis' -benchtime 50000x -count 2 ./e2e
echo "== ring lookup"
go test -run '^$' -bench 'Owner' -benchmem ./ring
echo "== one node over loopback: rlnode bench, 64 clients, 10s each, with the node's CPU per check"
bin=$(mktemp -d)/rlnode
go build -o "$bin" ./cmd/rlnode
"$bin" --http-addr 127.0.0.1:18080 --grpc-addr 127.0.0.1:18081 --peer-addr 127.0.0.1:18082 \
	--gossip-addr 127.0.0.1:17946 --node-name bench --log-level warn &
node=$!
trap 'kill $node 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -sf 127.0.0.1:18080/readyz >/dev/null && break; sleep 0.1; done
for proto in grpc http; do
	port=18081; [ $proto = http ] && port=18080
	for items in 1 100; do
		echo "-- $proto, $items check(s) a request"
		"$bin" bench --addr 127.0.0.1:$port --protocol $proto --items $items --concurrency 64 --duration 10s \
			--metrics 127.0.0.1:18080
	done
done
echo "-- grpc through the Go client's Allow, 64 goroutines"
"$bin" bench --addr 127.0.0.1:18081 --client --concurrency 64 --duration 10s --metrics 127.0.0.1:18080
kill $node; wait $node 2>/dev/null || true
# (scripts/bench-cluster.sh measures the three-node figures below before
# and after the streams and the codec, interleaved: docs/bench/cpu.md.)
echo "== three rlnode processes over loopback: server CPU per check summed over the nodes, 50 callers"
nodes=()
trap 'kill "${nodes[@]}" 2>/dev/null || true' EXIT
for i in 0 1 2; do
	join=(); [ $i -gt 0 ] && join=(--join 127.0.0.1:27946)
	"$bin" --http-addr 127.0.0.1:2${i}080 --grpc-addr 127.0.0.1:2${i}081 --peer-addr 127.0.0.1:2${i}082 \
		--gossip-addr 127.0.0.1:2$((7 + i))946 --node-name bench-$i --log-level warn "${join[@]}" &
	nodes+=($!)
done
for i in 0 1 2; do for _ in $(seq 100); do curl -sf 127.0.0.1:2${i}080/readyz >/dev/null && break; sleep 0.1; done; done
sleep 2 # let the ring converge on every node
metrics=127.0.0.1:20080,127.0.0.1:21080,127.0.0.1:22080
echo "-- 10 checks a request, all into one node"
"$bin" bench --addr 127.0.0.1:20081 --items 10 --concurrency 50 --duration 10s --metrics $metrics
echo "-- the Go client's Allow, all into one node"
"$bin" bench --addr 127.0.0.1:20081 --client --concurrency 50 --duration 10s --metrics $metrics
echo "-- the Go client's Allow, routed to each key's owner"
"$bin" bench --addrs 127.0.0.1:20081,127.0.0.1:21081,127.0.0.1:22081 --client --route --concurrency 50 --duration 10s --metrics $metrics
kill "${nodes[@]}"; wait "${nodes[@]}" 2>/dev/null || true
echo "== 3-node loopback cluster (in one process): forwarded checks, hot key"
go test -run '^$' -bench 'Forwarded|HotKey' -benchtime 3s -benchmem ./cmd/rlnode
echo "== one rlnode vs a Redis+Lua limiter (go-redis/redis_rate)"
go test -run '^$' -bench 'VersusRedis' -benchtime 5s ./e2e
