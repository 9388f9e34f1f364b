#!/bin/sh
# First start: a cluster in $PGDATA with the POSTGRES_USER superuser (password auth for TCP),
# and POSTGRES_DB. Then exec the server (PID 1, so `docker stop` shuts it down cleanly).
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
  user=${POSTGRES_USER:-postgres}
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" -E UTF8 --auth-local=trust \
    --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -k /tmp" -w start >/dev/null
  db=${POSTGRES_DB:-$user}
  if [ "$db" != postgres ]; then
    psql -h /tmp -U "$user" -d postgres -v ON_ERROR_STOP=1 -q -c "CREATE DATABASE \"$db\"" >/dev/null
  fi
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  echo "postgres-entrypoint: initialised $PGDATA"
fi
exec "$@" -k /var/run/postgresql
