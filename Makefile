# The README's commands. `make test` is what CI runs.
.PHONY: test e2e generate bench fuzz

test:
	go test -race ./...

# The tests that run real rlnode processes (also part of `make test`).
e2e:
	go test -race ./e2e/

generate:
	protoc -I api/proto --go_out=api/ringlimitv1 --go_opt=paths=source_relative \
		--go-grpc_out=api/ringlimitv1 --go-grpc_opt=paths=source_relative \
		api/proto/ringlimit.proto api/proto/peer.proto

# Every benchmark quoted in BENCHMARKS.md, in one run. Needs redis-server
# for the Redis+Lua baseline (apt-get install redis-server); the rest needs
# only Go. Takes about five minutes; results go to bench.out.
bench:
	scripts/bench.sh | tee bench.out

# Each fuzz target for FUZZTIME (10s by default: make fuzz FUZZTIME=5m for
# longer). Their seed corpora already run as unit tests in `make test`;
# a failure found here is saved under the package's testdata/fuzz.
FUZZTIME ?= 10s
fuzz:
	go test -run '^$$' -fuzz '^FuzzDecodeCheckRequest$$' -fuzztime $(FUZZTIME) ./api
	go test -run '^$$' -fuzz '^FuzzValidate$$' -fuzztime $(FUZZTIME) ./service
	go test -run '^$$' -fuzz '^FuzzTake$$' -fuzztime $(FUZZTIME) ./algorithms
	go test -run '^$$' -fuzz '^FuzzUnmarshalState$$' -fuzztime $(FUZZTIME) ./algorithms
	go test -run '^$$' -fuzz '^FuzzCounter$$' -fuzztime $(FUZZTIME) ./limiter
	go test -run '^$$' -fuzz '^FuzzForwardedFor$$' -fuzztime $(FUZZTIME) ./httplimit
	go test -run '^$$' -fuzz '^FuzzClientIP$$' -fuzztime $(FUZZTIME) ./httplimit
	go test -run '^$$' -fuzz '^FuzzLoad$$' -fuzztime $(FUZZTIME) ./policy
	go test -run '^$$' -fuzz '^FuzzShouldRateLimit$$' -fuzztime $(FUZZTIME) ./rls
