# The README's commands. `make test` is what CI runs.
.PHONY: test test-loaded e2e chaos scale generate bench plots fuzz image cluster cluster-down

# e2e runs real clusters for about ten minutes on two cores: past go
# test's default timeout of 10m per package.
test:
	go test -race -timeout 30m ./...

# The tests of a node leaving, joining, crashing and coming back, each
# COUNT times (20 by default) with two busy loops on the cores, which end
# with the run, however it ends (scripts/test-loaded.sh; docs/handoff.md).
test-loaded:
	COUNT=$(COUNT) scripts/test-loaded.sh

COUNT ?= 20

# The tests that run real rlnode processes (also part of `make test`).
e2e:
	go test -race -timeout 30m ./e2e/

# The chaos suite on containers of the image (docs/chaos.md); needs Docker.
chaos: image
	RINGLIMIT_IMAGE=$(IMAGE) go test -tags chaos -count=1 -v -run '^TestChaos' -timeout 15m ./e2e/

# 32 rlnode processes on loopback, measured (docs/scale.md): convergence,
# key shares, gossip, goroutines, sockets and RSS, a join's and a leave's
# hand-off of 1,000,000 counters, kill -9 detection, exact checks throughout.
# Build-tagged, so `make test` stays fast; the table goes to build/scale.md.
scale:
	RINGLIMIT_SCALE_OUT=$(CURDIR)/build/scale.md go test -tags scale -count=1 -v -run '^TestScale$$' -timeout 20m ./e2e/

# The public API (api/proto, for clients) and the peer protocol
# (internal/peerpb, between nodes only) are generated apart: the peer
# protocol imports the public check types.
generate:
	protoc -I api/proto --go_out=api/ringlimitv1 --go_opt=paths=source_relative \
		--go-grpc_out=api/ringlimitv1 --go-grpc_opt=paths=source_relative \
		api/proto/ringlimit.proto
	protoc -I api/proto -I internal/peerpb \
		--go_out=internal/peerpb --go_opt=paths=source_relative \
		--go_opt=Mringlimit.proto=github.com/ringlimit/ringlimit/api/ringlimitv1 \
		--go-grpc_out=internal/peerpb --go-grpc_opt=paths=source_relative \
		internal/peerpb/peer.proto

# Most benchmarks quoted in BENCHMARKS.md and docs/bench/, in one run. Needs redis-server
# for the Redis+Lua baseline (apt-get install redis-server); the rest needs
# only Go. Takes about five minutes; results go to bench.out.
bench:
	scripts/bench.sh | tee bench.out

# The charts in docs/bench/ (see BENCHMARKS.md and docs/bench/client.md): one rlnode and one
# redis-server on loopback, checks/s and p99 of one check a call at 1 to 64
# concurrent callers, through the Go client, gRPC, HTTP, the RESP port and
# Redis+Lua; each point the median of 3 runs of 1s, about three minutes in all. Needs redis-server. tools/plots is
# its own module, so that its plotting library stays out of go.mod.
plots:
	go build -o build/rlnode ./cmd/rlnode
	cd tools/plots && go run . -rlnode ../../build/rlnode -out ../../docs/bench

# Each fuzz target for FUZZTIME (10s by default: make fuzz FUZZTIME=5m for
# longer). Their seed corpora already run as unit tests in `make test`;
# a failure found here is saved under the package's testdata/fuzz.
FUZZTIME ?= 10s
fuzz:
	go test -run '^$$' -fuzz '^FuzzDecodeCheckRequest$$' -fuzztime $(FUZZTIME) ./internal/checkjson
	go test -run '^$$' -fuzz '^FuzzDecodeMatchesEncodingJSON$$' -fuzztime $(FUZZTIME) ./internal/checkjson
	go test -run '^$$' -fuzz '^FuzzAppendString$$' -fuzztime $(FUZZTIME) ./internal/checkjson
	go test -run '^$$' -fuzz '^FuzzUnmarshal$$' -fuzztime $(FUZZTIME) ./internal/wire
	go test -run '^$$' -fuzz '^FuzzMarshal$$' -fuzztime $(FUZZTIME) ./internal/wire
	go test -run '^$$' -fuzz '^FuzzCountMessages$$' -fuzztime $(FUZZTIME) ./internal/wire
	go test -run '^$$' -fuzz '^FuzzValidate$$' -fuzztime $(FUZZTIME) ./checks
	go test -run '^$$' -fuzz '^FuzzBorrowing$$' -fuzztime $(FUZZTIME) ./borrow
	go test -run '^$$' -fuzz '^FuzzPeerHandlers$$' -fuzztime $(FUZZTIME) ./service
	go test -run '^$$' -fuzz '^FuzzTake$$' -fuzztime $(FUZZTIME) ./algorithms
	go test -run '^$$' -fuzz '^FuzzUnmarshalState$$' -fuzztime $(FUZZTIME) ./algorithms
	go test -run '^$$' -fuzz '^FuzzClamp$$' -fuzztime $(FUZZTIME) ./algorithms
	go test -run '^$$' -fuzz '^FuzzCounter$$' -fuzztime $(FUZZTIME) ./limiter
	go test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./snapshot
	go test -run '^$$' -fuzz '^FuzzForwardedFor$$' -fuzztime $(FUZZTIME) ./httplimit
	go test -run '^$$' -fuzz '^FuzzClientIP$$' -fuzztime $(FUZZTIME) ./httplimit
	go test -run '^$$' -fuzz '^FuzzLoad$$' -fuzztime $(FUZZTIME) ./policy
	go test -run '^$$' -fuzz '^FuzzShouldRateLimit$$' -fuzztime $(FUZZTIME) ./rls
	go test -run '^$$' -fuzz '^FuzzParseGossipKeys$$' -fuzztime $(FUZZTIME) ./cmd/rlnode
	go test -run '^$$' -fuzz '^FuzzCPUSeconds$$' -fuzztime $(FUZZTIME) ./loadgen
	go test -run '^$$' -fuzz '^FuzzLease$$' -fuzztime $(FUZZTIME) ./lease
	go test -run '^$$' -fuzz '^FuzzLeaseRelayCodec$$' -fuzztime $(FUZZTIME) ./peer
	go test -run '^$$' -fuzz '^FuzzPeerCodec$$' -fuzztime $(FUZZTIME) ./peer
	go test -run '^$$' -fuzz '^FuzzValidate$$' -fuzztime $(FUZZTIME) ./rlqs
	go test -run '^$$' -fuzz '^FuzzReader$$' -fuzztime $(FUZZTIME) ./resp
	go test -run '^$$' -fuzz '^FuzzCommands$$' -fuzztime $(FUZZTIME) ./resp
	go test -run '^$$' -fuzz '^FuzzReadAnswer$$' -fuzztime $(FUZZTIME) ./internal/respcall
	go test -run '^$$' -fuzz '^FuzzConnEndings$$' -fuzztime $(FUZZTIME) ./resp
	go test -run '^$$' -fuzz '^FuzzSniff$$' -fuzztime $(FUZZTIME) ./internal/nodeport

# The container image (see Dockerfile): a static rlnode built here, copied
# into an image FROM scratch. IMAGE, VERSION and REVISION may be overridden.
IMAGE ?= ringlimit:dev
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)

image:
	rm -rf build/image && mkdir -p build/image
	CGO_ENABLED=0 go build -trimpath -buildvcs=auto -ldflags='-s -w' -o build/image/rlnode ./cmd/rlnode
	chmod 0555 build/image/rlnode
	docker build --quiet -f Dockerfile -t $(IMAGE) \
		--build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) build/image
	@docker image inspect --format '$(IMAGE): {{.Size}} bytes' $(IMAGE)

# A local three-node cluster from the image (deploy/docker-compose.yml),
# HTTP and gRPC published on 127.0.0.1 only. Works with the Compose plugin
# (docker compose) or the standalone docker-compose.
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo docker compose || echo docker-compose)
COMPOSE_FILE := deploy/docker-compose.yml

cluster: image
	RINGLIMIT_IMAGE=$(IMAGE) $(COMPOSE) -f $(COMPOSE_FILE) -p ringlimit up -d
	@for i in $$(seq 60); do curl -sf 127.0.0.1:8180/readyz >/dev/null && curl -sf 127.0.0.1:8280/readyz >/dev/null \
		&& curl -sf 127.0.0.1:8380/readyz >/dev/null && break; sleep 0.5; done
	@echo
	@echo "ringlimit: three nodes (rl-1, rl-2, rl-3); any node answers any key."
	@echo "  HTTP  127.0.0.1:8180  127.0.0.1:8280  127.0.0.1:8380"
	@echo "  gRPC  127.0.0.1:8181  127.0.0.1:8281  127.0.0.1:8381"
	@echo
	@echo "  curl -s 127.0.0.1:8180/v1/members"
	@echo "  curl -s -X POST 127.0.0.1:8280/v1/check -H 'Content-Type: application/json' -d '{\"requests\":[{\"name\":\"api\",\"key\":\"user:42\",\"limit\":10,\"duration_ms\":60000}]}'"
	@echo "  go run ./cmd/rlnode check --addr 127.0.0.1:8381 --name api --key user:42 --limit 10 --duration 1m"
	@echo "  $(COMPOSE) -f $(COMPOSE_FILE) -p ringlimit logs -f    # logs;  make cluster-down  # stop"

cluster-down:
	$(COMPOSE) -f $(COMPOSE_FILE) -p ringlimit down --timeout 45
