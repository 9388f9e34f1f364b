#!/usr/bin/env bash
# One command: install EagleNest and run the service (API + worker, embedded defaults).
#   bash scripts/up.sh [--host 127.0.0.1] [--port 8080] [--data-dir .eaglenest]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check -e '.[train]'
exec eaglenest up "$@"
