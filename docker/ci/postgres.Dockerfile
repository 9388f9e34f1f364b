# CI stand-in for postgres:16-alpine (no registry in CI): Debian's postgresql package on the
# local base image. Same contract as the official image for what docker-compose.yml uses:
# POSTGRES_USER / POSTGRES_DB / POSTGRES_PASSWORD create the role and database on the first
# start, data in /var/lib/postgresql/data, pg_isready in PATH. Listens on 127.0.0.1:5432
# (CI runs every container with host networking). Build context: docker/ci.
ARG BASE_IMAGE=local/debian:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql \
      >/dev/null \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p -m 0700 /var/lib/postgresql/data \
 && chown postgres:postgres /var/lib/postgresql/data \
 && for tool in initdb pg_ctl postgres psql pg_isready; do \
      ln -s /usr/lib/postgresql/*/bin/$tool /usr/local/bin/; done
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PGDATA=/var/lib/postgresql/data
USER postgres
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
CMD ["postgres", "-c", "listen_addresses=127.0.0.1", "-p", "5432"]
