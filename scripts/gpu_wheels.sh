#!/usr/bin/env bash
# The service's wheels for the GPU host's Python (default 3.12, manylinux x86_64), from the
# committed lock (requirements/service.txt) minus what the host brings (torch and its
# dependencies, transformers) and what the check does not use (psycopg: SQLite here;
# matplotlib and its dependencies: the check's job runs no benchmark stage to plot): the GPU
# check's `service` section installs them offline into a venv over the host's torch.
#   bash scripts/gpu_wheels.sh [OUT_DIR] [PYTHON_VERSION]    # default .gpu-wheels 3.12
# The folder must stay under 64 MiB to travel with the tree (`carry` of the device tool).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.gpu-wheels}
pyver=${2:-3.12}
skip='^(torch|triton|nvidia-[a-z0-9-]*|transformers|tokenizers|safetensors|huggingface[-_]hub|psycopg[a-z-]*|numpy|sympy|networkx|jinja2|markupsafe|filelock|fsspec|mpmath|setuptools|pyyaml|regex|tqdm|hf-xet|matplotlib|pillow|fonttools|kiwisolver|contourpy|cycler|pyparsing)(\[|=)'
reqs=$(mktemp)
trap 'rm -f "$reqs"' EXIT
grep -E '^[A-Za-z0-9]' requirements/service.txt | grep -viE "$skip" > "$reqs"
rm -rf "$out"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
  --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 -d "$out" -r "$reqs"
du -sh "$out"
