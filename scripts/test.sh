#!/usr/bin/env bash
# One command: set everything up on a fresh machine and run the test suite.
#   bash scripts/test.sh            # lint, type-check, default tests
#   bash scripts/test.sh -m slow    # extra pytest arguments are passed through
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install -q --disable-pip-version-check -e '.[train,dev]'

# Real Postgres and Redis for tests/integration (Debian packages; the suite starts them).
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || [ ! -x /usr/bin/redis-server ]; then
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql redis-server >/dev/null
fi

echo "== ruff"
python3 -m ruff check .
echo "== mypy"
python3 -m mypy
echo "== pytest"
set +e
python3 -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$rc"
