#!/usr/bin/env bash
# The head race (benchmarks/gpu_check/race.py) on a CUDA host, with SmolLM2-135M-Instruct as
# the real target. The host has no network, so the model travels as files: its GGUF (98 MB,
# the file models/prepare.py converts here too) in two parts under .gpu-target/, with the
# wheel of the `gguf` reader (the lock's version) that the conversion needs.
#   bash scripts/gpu_race.sh pack             # here: fill .gpu-target/ (ignored by git)
#   bash scripts/gpu_race.sh run [ARGS ...]   # there: join, convert, race; ARGS go to
#                                             # scripts/gpu_check.sh (e.g. --race-minutes 3)
# The device tool carries at most 64 MiB a call: carry .gpu-target/part-0 and .gpu-target/
# wheels in one call, .gpu-target/part-1 in the next, which runs `run` (a warm machine keeps
# the ignored files an earlier call brought).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.gpu-target
gguf_name=SmolLM2-135M-Instruct.Q4_1.gguf
case "${1:-}" in
  pack)
    PY=${PY:-.venv/bin/python}
    src=$("$PY" -c 'from eaglenest.models.prepare import find_gguf; print(find_gguf())')
    rm -rf "$dir" && mkdir -p "$dir/wheels"
    split -n 2 -d -a 1 "$src" "$dir/part-"
    pin=$(grep -E '^gguf==' requirements/lock.txt)
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$dir/wheels" "$pin"
    du -sh "$dir"/part-* "$dir/wheels"
    ;;
  run)
    shift
    if [ ! -f "$dir/smollm2/model.safetensors" ]; then
      cat "$dir"/part-0 "$dir"/part-1 > "$dir/$gguf_name"
      wheel=$(ls "$dir"/wheels/gguf-*.whl)
      # a pure-Python wheel imports from the zip itself; the repository root gives eaglenest
      PYTHONPATH="$PWD/$wheel:$PWD" "${PYTHON:-python3}" -c "
import sys
from pathlib import Path
from eaglenest.models.prepare import prepare_smollm2
prepare_smollm2(Path(sys.argv[1]) / 'smollm2', Path(sys.argv[1]))" "$dir"
    fi
    exec bash scripts/gpu_check.sh --sections "" --race-target "$dir/smollm2" "$@"
    ;;
  *)
    echo "usage: bash scripts/gpu_race.sh pack | run [gpu_check.sh ARGS ...]" >&2
    exit 2
    ;;
esac
