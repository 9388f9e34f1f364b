"""Built-in training datasets shipped in the package under the seed names.

They are small samples written for EagleNest (no downloads): enough to exercise every
reader and to train a demo head, not a substitute for real traffic.
"""

from __future__ import annotations

from pathlib import Path

BUILTIN_DIR = Path(__file__).parent / "builtin"
BUILTIN_NAMES = (
    "gsm8k_training.jsonl",
    "magicoder.jsonl",
    "opencodeinstruct.jsonl",
    "swebench_oracle_train.jsonl",
    "ultrachat_0_8k_515292.jsonl",
)
PREFIX = "builtin:"


def is_builtin(name: str) -> bool:
    return name.removeprefix(PREFIX) in BUILTIN_NAMES and not Path(name).exists()


def builtin_path(name: str) -> Path:
    name = name.removeprefix(PREFIX)
    if name not in BUILTIN_NAMES:
        raise KeyError(f"unknown built-in dataset {name!r}; known: {', '.join(BUILTIN_NAMES)}")
    return BUILTIN_DIR / name
