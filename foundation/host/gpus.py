"""A worker's GPUs: what it may place work on, and how a child process is shown them.

Contract:
- `inventory(spec)` is the worker's GPUs, from ``EAGLENEST_GPUS`` (`Settings.gpus`):
  unset or empty: every GPU the worker sees (`detect()`: none on a host without them);
  ``none``: no GPU; ``0,2``: only these of the detected GPUs (the worker's indexes);
  ``4x24GiB`` (or ``2x80GiB:H100``): a declared inventory of that many GPUs of that size
  (tests, and hosts whose GPUs other software shares). A bad value raises GpuSpecError.
- `detect()` sees what CUDA shows the worker: the physical GPUs ``nvidia-smi`` lists
  (which ignores ``CUDA_VISIBLE_DEVICES``), narrowed and ordered by the worker's own
  ``CUDA_VISIBLE_DEVICES`` as CUDA reads it (physical indexes or ``GPU-<uuid>`` entries,
  a unique prefix enough; the list ends at an entry that names no GPU; empty: no GPU;
  unset: all). Where nvidia-smi's numbering may not be CUDA's (unlike GPUs without
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, an entry it cannot map such as a MIG device), and
  without nvidia-smi, torch is asked in a child process (the worker never initialises CUDA
  itself: its forked pool processes could not use it).
- A GPU's `index` is its number in the worker's own CUDA view (torch's ``cuda:<index>``,
  0..n-1). A child is shown its GPUs with `visible_devices()`: the worker's own
  ``CUDA_VISIBLE_DEVICES`` (when the operator set one) maps each index to the entry the
  operator gave, so a child never sees a GPU the worker was not given.
- `Gpu.capability` is its CUDA compute capability (8.6 for an A10G): nvidia-smi's
  ``compute_cap``, torch's major.minor, or for a declared inventory the accelerator's
  (instance_types.COMPUTE_CAPABILITY); None when unknown (old nvidia-smi, rows stored
  before it was recorded).
- A type fits a GPU when the GPU has at least `MEMORY_TOLERANCE` of the type's memory per
  accelerator: the CUDA runtime reports a little less than the marketing figure (an A10G
  "24 GiB" reports 22.5 GiB, an H100 "80 GiB" 79.1 GiB).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from eaglenest.foundation.instance_types import COMPUTE_CAPABILITY

log = logging.getLogger("eaglenest.gpus")
#: the share of an instance type's memory per accelerator a GPU must report to hold it
MEMORY_TOLERANCE = 0.9
_DECLARED = re.compile(r"^(\d+)x(\d+(?:\.\d+)?)GiB(?::([\w .-]+))?$")
_QUERY = "index,uuid,name,memory.total"


class GpuSpecError(ValueError):
    """EAGLENEST_GPUS cannot be read, or names GPUs the worker does not have."""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_gib: float
    capability: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Gpu:
        """Also a row stored before `capability` was recorded (None)."""
        cap = raw.get("capability")
        return cls(int(raw["index"]), str(raw["name"]), float(raw["memory_gib"]),
                   None if cap is None else float(cap))

    def fits(self, memory_gib: float) -> bool:
        """Whether an accelerator of `memory_gib` (an instance type's) fits this GPU."""
        return self.memory_gib >= MEMORY_TOLERANCE * memory_gib


@dataclass(frozen=True)
class Physical:
    """A GPU as nvidia-smi lists it: its physical index and UUID (``GPU-...``)."""

    index: int
    uuid: str
    gpu: Gpu


def detect(environ: Mapping[str, str] | None = None) -> list[Gpu]:
    """The GPUs CUDA shows this process under `environ` (os.environ): module contract."""
    env = os.environ if environ is None else environ
    physical = nvidia_smi()
    if physical is None:
        return _torch_child(env)
    gpus, exact = cuda_view(physical, env)
    if not exact:
        probed = _torch_child(env)
        if probed:
            return probed
        log.warning("GPUs listed by nvidia-smi in its order (torch could not be asked): %s",
                    ", ".join(g.name for g in gpus))
    return gpus


def cuda_view(physical: list[Physical], environ: Mapping[str, str]) -> tuple[list[Gpu], bool]:
    """The GPUs CUDA numbers 0..n-1 under `environ`'s CUDA_VISIBLE_DEVICES, and whether
    that is certainly CUDA's numbering (False: ask CUDA itself; module contract)."""
    ordered = sorted(physical, key=lambda p: p.index)
    alike = len({(p.gpu.name, p.gpu.memory_gib) for p in ordered}) <= 1
    exact = alike or environ.get("CUDA_DEVICE_ORDER", "").strip() == "PCI_BUS_ID"
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        chosen = ordered
    else:
        chosen = []
        for entry in (e.strip() for e in raw.split(",")):
            found = _match(ordered, entry)
            if found is None or found in chosen:  # CUDA ignores this entry and the rest
                if entry:  # a MIG device, a typo, a repeat: CUDA's own view is asked
                    log.warning("CUDA_VISIBLE_DEVICES=%r: %r is not one more GPU nvidia-smi "
                                "lists", raw, entry)
                    exact = False
                break
            chosen.append(found)
    return [replace(p.gpu, index=i) for i, p in enumerate(chosen)], exact


def _match(physical: list[Physical], entry: str) -> Physical | None:
    """The GPU an entry of CUDA_VISIBLE_DEVICES names: a physical index, or a UUID or a
    prefix of one that only one GPU has; None when it names none (or several)."""
    if entry.isdigit():
        return next((p for p in physical if p.index == int(entry)), None)
    want = entry.lower()
    if not want.startswith("gpu-"):
        return None
    hits = [p for p in physical if p.uuid.lower().startswith(want)]
    return hits[0] if len(hits) == 1 else None


def nvidia_smi() -> list[Physical] | None:
    """Every GPU of the machine, as nvidia-smi lists it (CUDA_VISIBLE_DEVICES does not
    narrow it); None when nvidia-smi is absent or fails. An nvidia-smi too old to report
    ``compute_cap`` is asked without it (capability None)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    for fields in (f"{_QUERY},compute_cap", _QUERY):
        try:
            text = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, timeout=20, check=True).stdout
        except subprocess.CalledProcessError:
            continue  # e.g. "compute_cap" is not a valid field to query
        except (OSError, subprocess.SubprocessError):
            return None
        try:
            return [_parse(line, fields.endswith("compute_cap"))
                    for line in text.splitlines() if line.strip()]
        except (ValueError, IndexError):
            log.warning("nvidia-smi answered what cannot be read: %r", text[:200])
            return None
    return None


def _parse(line: str, with_capability: bool) -> Physical:
    parts = [p.strip() for p in line.split(",")]
    cap = _number(parts.pop()) if with_capability else None
    memory = _number(parts.pop())
    index, uuid, name = int(parts[0]), parts[1], ",".join(parts[2:]).strip()
    return Physical(index, uuid, Gpu(index, name, round((memory or 0.0) / 1024, 2), cap))


def _number(text: str) -> float | None:
    """A figure nvidia-smi reports; None for ``[N/A]`` and the like."""
    try:
        return float(text)
    except ValueError:
        return None


_PROBE = ("import json, torch\n"
          "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
          "p = [torch.cuda.get_device_properties(i) for i in range(n)]\n"
          "print(json.dumps([[d.name, d.total_memory, d.major, d.minor] for d in p]))")


def _torch_child(environ: Mapping[str, str]) -> list[Gpu]:
    """torch.cuda's GPUs, asked in a child process under `environ` ([]: no torch, no CUDA)."""
    try:
        text = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                              timeout=120, check=True, env=dict(environ)).stdout
        rows = json.loads(text.strip().splitlines()[-1])
        return [Gpu(i, str(name), round(int(total) / 2**30, 2), float(f"{major}.{minor}"))
                for i, (name, total, major, minor) in enumerate(rows)]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, TypeError):
        return []


def declared_capability(name: str) -> float | None:
    """The compute capability of a declared accelerator name (``H100``, ``NVIDIA A10G``)."""
    plain = name.strip()
    if plain.upper().startswith("NVIDIA "):
        plain = plain[len("NVIDIA "):].strip()
    return COMPUTE_CAPABILITY.get(plain)


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
        cap = declared_capability(name) if name else None
        return [Gpu(i, name or "declared", gib, cap) for i in range(count)]
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
    """CUDA_VISIBLE_DEVICES for a child that holds `indexes` (the worker's numbering): the
    worker's own entries for them when the operator set CUDA_VISIBLE_DEVICES, else the
    indexes themselves."""
    env = os.environ if environ is None else environ
    own = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if own:
        return ",".join(own[i] if i < len(own) else str(i) for i in indexes)
    return ",".join(str(i) for i in indexes)
