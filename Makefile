# The README's commands. `make test` is what CI runs.
.PHONY: test e2e generate bench fuzz image cluster cluster-down

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

# The container image (see Dockerfile): a static rlnode built here, copied
# into an image FROM scratch. IMAGE, VERSION and REVISION may be overridden.
IMAGE ?= ringlimit:dev
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)

image:
	rm -rf build/image && mkdir -p build/image
	CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o build/image/rlnode ./cmd/rlnode
	chmod 0555 build/image/rlnode
	docker build --quiet -f Dockerfile -t $(IMAGE) \
		--build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) build/image
	@docker image inspect --format '$(IMAGE): {{.Size}} bytes' $(IMAGE)
