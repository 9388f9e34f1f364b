#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check): training steps/s, fp32 losslessness of the engine's
# greedy modes against HF generate, the target's verification-cost curve with the oracle
# speed ceiling, and batch-1 tokens/s, on random 1B / 8B Llama targets built on the device.
#   bash scripts/gpu_check.sh [--device cuda|cpu] [--tiny] [--out DIR] [--models 1b,8b] ...
# Needs only torch + transformers + safetensors (no install, no network): the repository
# root goes on PYTHONPATH. Prints the markdown tables; writes gpu_check.json (after every
# section) and gpu_check.md to --out (default: $OUT if set, else ./gpu_check_out).
# PYTHON picks the interpreter (default python3). Exit status 1: fp32 check or a section failed.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
exec "${PYTHON:-python3}" -m benchmarks.gpu_check "$@"
