# The rlnode image: one static binary and nothing else (no shell, no
# package manager, no libc), run as a numeric non-root user.
#
# The binary is built on the host, not in a builder stage, so that the
# image builds on a machine that can pull no base image. `make image` does
# both steps:
#
#   CGO_ENABLED=0 go build -trimpath -o build/image/rlnode ./cmd/rlnode
#   docker build -f Dockerfile -t ringlimit:dev build/image
FROM scratch

ARG VERSION=dev
ARG REVISION=unknown

LABEL org.opencontainers.image.title="ringlimit" \
      org.opencontainers.image.description="Distributed rate limiter: a ring of rlnode processes, no Redis" \
      org.opencontainers.image.source="https://github.com/ringlimit/ringlimit" \
      org.opencontainers.image.url="https://github.com/ringlimit/ringlimit" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"

# Owned by root and not writable by the user it runs as.
COPY --chown=0:0 rlnode /rlnode

# 65532 is the conventional "nonroot" id; numeric, so that Kubernetes can
# check runAsNonRoot without an /etc/passwd in the image.
USER 65532:65532

# HTTP (check, /metrics, /healthz, /readyz), gRPC (clients), peer gRPC
# (forwards, hand-off, GLOBAL sync; keep private), memberlist gossip.
EXPOSE 8080/tcp 8081/tcp 8082/tcp 7946/tcp 7946/udp

# The addresses are given, so that the node listens on every interface of
# the container (its own network; reached only as its ports are published
# or as its network allows): without them, a node with no TLS and no
# gossip key listens on loopback only, which nothing outside the
# container reaches. A flag or another RLNODE_* value overrides them.
ENV RLNODE_HTTP_ADDR=:8080 RLNODE_GRPC_ADDR=:8081 RLNODE_PEER_ADDR=:8082 RLNODE_GOSSIP_ADDR=:7946

ENTRYPOINT ["/rlnode"]
