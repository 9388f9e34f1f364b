#!/usr/bin/env bash
# The peer suite: moto's own SageMaker tests, at the moto version of requirements/lock.txt,
# run in moto's server mode against a fresh EagleNest (API and broker, no serve worker).
# Tests that encode moto-only behaviour are listed, with the AWS behaviour they contradict,
# in tests/peer/moto_excluded.txt (tests/peer/moto_plugin.py applies the list).
#   bash scripts/peer_suite.sh [extra pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3

VERSION=$(sed -n 's/^moto==\([^ ;]*\).*/\1/p' requirements/lock.txt)
[ -n "$VERSION" ] || { echo "moto is not pinned in requirements/lock.txt" >&2; exit 1; }
CACHE=$ROOT/.cache/peer
SDIST=$CACHE/moto-$VERSION.tar.gz
mkdir -p "$CACHE"
if [ ! -f "$SDIST" ]; then
  "$PY" -m pip download -q --no-binary :all: --no-deps "moto==$VERSION" -d "$CACHE"
fi

WORK=$(mktemp -d)
STACK_PID=""
cleanup() {
  if [ -n "$STACK_PID" ] && kill -0 "$STACK_PID" 2>/dev/null; then
    kill -TERM "$STACK_PID"; wait "$STACK_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
FILES="test_sagemaker_models.py test_sagemaker_endpoint.py test_sagemaker_integration.py"
mkdir -p "$WORK/tests"
for f in $FILES; do
  tar -xzf "$SDIST" -C "$WORK/tests" --strip-components=3 "moto-$VERSION/tests/test_sagemaker/$f"
done

PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# moto's server mode signs with its fake keys: EagleNest is given the same ones
EAGLENEST_DATA_DIR=$WORK/data EAGLENEST_ACCESS_KEY_ID=FOOBARKEY \
  EAGLENEST_SECRET_ACCESS_KEY=FOOBARSECRET EAGLENEST_ACCOUNT_ID=123456789012 \
  EAGLENEST_REGION=us-east-1 EAGLENEST_WORKER_QUEUES="" \
  "$PY" -m eaglenest.cli up --port "$PORT" >"$WORK/stack.log" 2>&1 &
STACK_PID=$!
for _ in $(seq 1 120); do
  if "$PY" -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:$PORT/ping').status_code != 200)" 2>/dev/null; then
    break
  fi
  kill -0 "$STACK_PID" 2>/dev/null || { cat "$WORK/stack.log" >&2; exit 1; }
  sleep 0.5
done

cd "$WORK"
env TEST_SERVER_MODE=true TEST_SERVER_MODE_ENDPOINT="http://127.0.0.1:$PORT" \
  MOTO_CALL_RESET_API=false AWS_ACCESS_KEY_ID=FOOBARKEY AWS_SECRET_ACCESS_KEY=FOOBARSECRET \
  AWS_DEFAULT_REGION=us-east-1 PYTHONPATH="$ROOT/tests/peer" \
  "$PY" -m pytest -q -p moto_plugin -p no:cacheprovider -c /dev/null --rootdir "$WORK" \
  -o addopts="" "$@" tests
