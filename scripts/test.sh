#!/usr/bin/env bash
# One command: set everything up on a fresh machine and run the test suite.
#   bash scripts/test.sh            # lint, type-check, default tests
#   bash scripts/test.sh -m slow    # extra pytest arguments are passed through
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install -q --disable-pip-version-check -e '.[train,dev]'

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
