"""A worker's GPUs: what it may place work on, and how a child process is shown them.

Contract:
- `inventory(spec)` is the worker's GPUs, from ``EAGLENEST_GPUS`` (`Settings.gpus`):
  unset or empty: every GPU the worker sees (torch.cuda, else ``nvidia-smi``; none on a
  host without them); ``none``: no GPU; ``0,2``: only these of the detected GPUs;
  ``4x24GiB`` (or ``2x80GiB:H100``): a declared inventory of that many GPUs of that size
  (tests, and hosts whose GPUs other software shares). A bad value raises GpuSpecError.
- A GPU's `index` is its number in the worker's own CUDA view (torch's ``cuda:<index>``).
  A child is shown its GPUs with `visible_devices()`: the worker's own
  ``CUDA_VISIBLE_DEVICES`` (when the operator set one) maps each index to what the child
  must be given, so a child never sees a GPU the worker was not given.
- A type fits a GPU when the GPU has at least `MEMORY_TOLERANCE` of the type's memory per
  accelerator: the CUDA runtime reports a little less than the marketing figure (an A10G
  "24 GiB" reports 22.5 GiB, an H100 "80 GiB" 79.1 GiB).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

#: the share of an instance type's memory per accelerator a GPU must report to hold it
MEMORY_TOLERANCE = 0.9
_DECLARED = re.compile(r"^(\d+)x(\d+(?:\.\d+)?)GiB(?::([\w .-]+))?$")


class GpuSpecError(ValueError):
    """EAGLENEST_GPUS cannot be read, or names GPUs the worker does not have."""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_gib: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Gpu:
        return cls(int(raw["index"]), str(raw["name"]), float(raw["memory_gib"]))

    def fits(self, memory_gib: float) -> bool:
        """Whether an accelerator of `memory_gib` (an instance type's) fits this GPU."""
        return self.memory_gib >= MEMORY_TOLERANCE * memory_gib


def detect() -> list[Gpu]:
    """The GPUs this process would see: nvidia-smi, else torch.cuda asked in a child process
    (a worker never initialises CUDA itself: its forked pool processes could not use it)."""
    found = _nvidia_smi()
    return found if found is not None else _torch_child()


_PROBE = ("import json, torch\n"
          "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
          "print(json.dumps([[torch.cuda.get_device_properties(i).name,"
          " torch.cuda.get_device_properties(i).total_memory] for i in range(n)]))")


def _torch_child() -> list[Gpu]:
    try:
        text = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                              timeout=120, check=True).stdout
        rows = json.loads(text.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return []  # no torch, or no CUDA
    return [Gpu(i, str(name), round(int(total) / 2**30, 2)) for i, (name, total) in enumerate(rows)]


def _nvidia_smi() -> list[Gpu] | None:
    """None when nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        text = subprocess.run([exe, "--query-gpu=name,memory.total",
                               "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = []
    for i, line in enumerate(x for x in text.splitlines() if x.strip()):
        name, mib = line.rsplit(",", 1)  # nvidia-smi numbers what CUDA_VISIBLE_DEVICES left
        gpus.append(Gpu(i, name.strip(), round(float(mib) / 1024, 2)))
    return gpus


def inventory(spec: str | None, detected: list[Gpu] | None = None) -> list[Gpu]:
    """The worker's GPUs under `spec` (EAGLENEST_GPUS; see the module contract).
    `detected` stands for what detect() would return (tests)."""
    raw = (spec or "").strip()
    if raw.lower() == "none":
        return []
    found = _DECLARED.match(raw.replace(" ", ""))
    if found:
        count, gib, name = int(found.group(1)), float(found.group(2)), found.group(3)
        if not 1 <= count <= 64:
            raise GpuSpecError(f"EAGLENEST_GPUS={raw!r}: 1 to 64 declared GPUs")
        return [Gpu(i, name or "declared", gib) for i in range(count)]
    have = detect() if detected is None else detected
    if not raw:
        return have
    wanted = []
    for part in raw.split(","):
        if not part.strip().isdigit():
            raise GpuSpecError(f"EAGLENEST_GPUS={raw!r} must be empty, 'none', GPU indexes "
                               "such as '0,1', or a declared inventory such as '4x24GiB'")
        wanted.append(int(part))
    by_index = {g.index: g for g in have}
    missing = [i for i in wanted if i not in by_index]
    if missing:
        raise GpuSpecError(f"EAGLENEST_GPUS={raw!r} names GPU {missing[0]}, but this worker "
                           f"sees {len(have)} GPU(s)")
    return [by_index[i] for i in sorted(set(wanted))]


def visible_devices(indexes: list[int], environ: Mapping[str, str] | None = None) -> str:
    """CUDA_VISIBLE_DEVICES for a child that holds `indexes` (the worker's numbering)."""
    env = os.environ if environ is None else environ
    own = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if own:
        return ",".join(own[i] if i < len(own) else str(i) for i in indexes)
    return ",".join(str(i) for i in indexes)
