#!/bin/sh
# The RLQS figures of docs/bench/envoy.md: three rlnode processes on loopback,
# 4 simulated Envoys (rlnode bench-rlqs) on one bucket of 400 a second for
# DURATION (3m), Envoy 0 asking 70% of the demand from SKEW (60s), and the
# third node stopped with SIGTERM at DRAIN (120s), so that its Envoy's
# stream moves; the Envoys report every INTERVAL (5s, as Envoy's filter does). Output: every second's admissions and the summary.
set -eu
DURATION=${DURATION:-3m}
SKEW=${SKEW:-60s}
DRAIN=${DRAIN:-120}
LIMIT=${LIMIT:-400}
INTERVAL=${INTERVAL:-5s}
dir=$(mktemp -d)
# The run's status is bench-rlqs's; stopping the nodes (one already
# stopped) must not change it, under set -e.
trap 'status=$?; set +e; kill $pids 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; exit $status' EXIT
go build -o "$dir/rlnode" ./cmd/rlnode
printf 'domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: %s}\n' "$LIMIT" > "$dir/edge.yaml"
pids=""
for i in 1 2 3; do
	join=""
	if [ "$i" -gt 1 ]; then join="--join 127.0.0.1:27946"; fi
	"$dir/rlnode" --node-name "rlqs-$i" --http-addr "127.0.0.1:2${i}080" --grpc-addr "127.0.0.1:2${i}081" \
		--peer-addr "127.0.0.1:2${i}082" --gossip-addr "127.0.0.1:2$((i + 6))946" --advertise-addr 127.0.0.1 \
		--policy-file "$dir/edge.yaml" $join 2>"$dir/node-$i.log" &
	pids="$pids $!"
	node3=$!
	sleep 1
done
sleep 2
"$dir/rlnode" bench-rlqs --addrs 127.0.0.1:21081,127.0.0.1:22081,127.0.0.1:23081 --domain edge --bucket tenant=t0 \
	--limit "$LIMIT" --envoys 4 --interval "$INTERVAL" --duration "$DURATION" --skew-after "$SKEW" --skew-callers 7 &
bench=$!
sleep "$DRAIN"
kill -TERM "$node3"
echo "rlqs-3 stopped (SIGTERM) at ${DRAIN}s of the run's start"
wait "$bench"
