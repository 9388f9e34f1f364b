#!/usr/bin/env bash
# One command: install EagleNest into .venv from the lock and run the service (API + worker,
# embedded defaults). Arguments go to `eaglenest up`, e.g. --port 8080.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh
ensure_venv requirements/service.txt
exec eaglenest up "$@"
