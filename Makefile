# The README's commands. `make test` is what CI runs.
.PHONY: test e2e generate bench fuzz

test:
	go test -race ./...

generate:
	protoc -I api/proto --go_out=api/ringlimitv1 --go_opt=paths=source_relative \
		--go-grpc_out=api/ringlimitv1 --go-grpc_opt=paths=source_relative \
		api/proto/ringlimit.proto api/proto/peer.proto

# Every benchmark quoted in BENCHMARKS.md, in one run. Needs redis-server
# for the Redis+Lua baseline (apt-get install redis-server); the rest needs
# only Go. Takes about five minutes; results go to bench.out.
bench:
	scripts/bench.sh | tee bench.out
