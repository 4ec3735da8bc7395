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

ENTRYPOINT ["/rlnode"]
