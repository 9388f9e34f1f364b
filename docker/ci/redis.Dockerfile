# CI stand-in for redis:7-alpine (no registry in CI): Debian's redis-server on the local base.
# As in the official image, the working directory is /data (the append-only file lands in
# the volume) and redis-server / redis-cli are in PATH.
ARG BASE_IMAGE=local/debian:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server \
      >/dev/null \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data && chown redis:redis /data
USER redis
WORKDIR /data
CMD ["redis-server"]
