# CI stand-in for prom/prometheus (no registry in CI): Debian bookworm's prometheus package
# (2.42, the upstream image's release line) on the local base. Laid out like the upstream
# image, so docker-compose.yml's entrypoint, command, volumes and healthcheck work on
# either: `prometheus` on the PATH, the data in /prometheus (the volume), the configuration
# and our console templates mounted under /etc/prometheus, which the server's user owns
# (the entrypoint writes the API's /metrics token there), wget for the healthcheck
# (busybox's in the upstream image). Debian's own service is never started (policy-rc.d);
# the web UI's assets are the package's (/usr/share/prometheus/web).
ARG BASE_IMAGE=local/debian:bookworm
FROM ${BASE_IMAGE}
RUN printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \
 && apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      prometheus wget >/dev/null \
 && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d \
 && mkdir -p /prometheus && chown prometheus:prometheus /prometheus /etc/prometheus
USER prometheus
WORKDIR /prometheus
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
