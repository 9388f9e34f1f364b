"""SageMaker instance types as data: the accelerators each one has, and the families refused.

Contract:
- `lookup(name)` returns the `InstanceType` of an ``ml.<family>.<size>`` name EagleNest
  serves: its accelerator count, the model of accelerator and the memory of each (GiB, as
  AWS publishes it). CPU-only types have 0 accelerators, 0 GiB and accelerator ``""``:
  they are served on the CPU.
- It raises `UnsupportedInstanceType` (a ValueError whose message names the type and says
  why) for a family EagleNest refuses (`REFUSED_FAMILIES`) and for a name it does not know.
- Every value of botocore's ``ProductionVariantInstanceType`` and
  ``OptimizationJobDeploymentInstanceType`` enums is one or the other
  (tests/foundation/test_instance_types.py), so a new botocore value cannot pass unmapped.
- Plain data: no botocore import, so a worker with the service dependencies only can use it.

docs/instance-types.md is the table in prose.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceType:
    """`accelerators` x `accelerator`, each with `memory_gib` GiB; (0, 0.0, "") for CPU only."""

    name: str
    accelerators: int
    memory_gib: float
    accelerator: str

    @property
    def compute_capability(self) -> float | None:
        """The CUDA compute capability of its accelerator (None: CPU only)."""
        return COMPUTE_CAPABILITY.get(self.accelerator)


class UnsupportedInstanceType(ValueError):
    """An instance type EagleNest does not serve; the message names it and says why."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name} is not supported by EagleNest: {reason}")
        self.name = name
        self.reason = reason

    def __reduce__(self) -> tuple[type[UnsupportedInstanceType], tuple[str, str]]:
        return type(self), (self.name, self.reason)


#: g4dn: one GPU but at 12xlarge (4); g5/g6/g6e add 24xlarge (4) and 48xlarge (8)
_G4DN_SIZES = {"xlarge": 1, "2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "16xlarge": 1,
               "12xlarge": 4}
_G_SIZES = {**_G4DN_SIZES, "24xlarge": 4, "48xlarge": 8}
#: g7/g7e: one GPU up to 8xlarge, then 2, 4 and 8
_G7_SIZES = {"2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "12xlarge": 2, "24xlarge": 4,
             "48xlarge": 8}

#: family -> (accelerator, GiB per accelerator, {size: accelerators}). Sources:
#: [batch] AWS Batch user guide, "Run GPU jobs" (GPU count and memory per type);
#: [sdk] aws/sagemaker-python-sdk src/sagemaker/image_uri_config/instance_gpu_info.json
#:       (Count, TotalGpuMemoryInMiB per ml. type);
#: [hyperpod] aws/sagemaker-hyperpod-cli src/sagemaker/hyperpod/training/constants.py
#:       (INSTANCE_RESOURCES gpu counts; per-GPU memory from the largest MIG profile);
#: [g7] not in [hyperpod] yet: third-party reports of the June 2026 launch (RTX PRO 4500
#:       Blackwell, 32 GB; 2, 4 and 8 GPUs at 12x, 24x and 48xlarge).
GPU_FAMILIES: dict[str, tuple[str, float, dict[str, int]]] = {
    "g4dn": ("T4", 16, _G4DN_SIZES),                                 # [batch], [sdk]
    "g5": ("A10G", 24, _G_SIZES),                                    # [batch], [sdk]
    "g6": ("L4", 24, _G_SIZES),                                      # [batch], [hyperpod]
    "g6e": ("L40S", 48, _G_SIZES),                                   # [hyperpod]; L40S: 48 GB
    "g7": ("RTX PRO 4500 Blackwell", 32, _G7_SIZES),                 # [g7]
    "g7e": ("RTX PRO 6000 Blackwell", 96, _G7_SIZES),                # [hyperpod]; 96 GB
    "p3": ("V100", 16, {"2xlarge": 1, "8xlarge": 4, "16xlarge": 8}),  # [batch], [sdk]
    "p3dn": ("V100", 32, {"24xlarge": 8}),                           # [sdk]
    "p4d": ("A100", 40, {"24xlarge": 8}),                            # [sdk]
    "p4de": ("A100", 80, {"24xlarge": 8}),                           # [sdk]
    "p5": ("H100", 80, {"4xlarge": 1, "48xlarge": 8}),               # [sdk], [hyperpod]
    "p5e": ("H200", 141, {"48xlarge": 8}),                           # [hyperpod]
    "p5en": ("H200", 141, {"48xlarge": 8}),                          # [hyperpod]
    "p6-b200": ("B200", 180, {"48xlarge": 8}),                       # [hyperpod]
    "p6-b300": ("B300", 268, {"48xlarge": 8}),                       # [hyperpod]; AWS ML blog: 268
    "p6e-gb200": ("GB200", 186, {"36xlarge": 4}),                    # [hyperpod]
}

#: accelerator -> CUDA compute capability (NVIDIA's published table): bfloat16 needs 8.0
COMPUTE_CAPABILITY = {
    "T4": 7.5, "V100": 7.0, "A10G": 8.6, "L4": 8.9, "L40S": 8.9, "A100": 8.0, "H100": 9.0,
    "H200": 9.0, "B200": 10.0, "B300": 10.3, "GB200": 10.0,
    "RTX PRO 4500 Blackwell": 12.0, "RTX PRO 6000 Blackwell": 12.0,
}

#: x86 (Intel) and Graviton (Arm) families without accelerators: served on the CPU
CPU_FAMILIES = frozenset({
    "t2", "m4", "m5", "m5d", "c4", "c5", "c5d", "r5", "r5d",
    "c6i", "m6i", "r6i", "m7i", "c7i", "r7i", "c6in",
    "c6g", "c6gd", "c6gn", "c7g", "m6g", "m6gd", "r6g", "r6gd", "r7gd", "r8g", "c8g", "m8g",
})
_CPU_SIZE = re.compile(r"^(medium|large|\d*xlarge)$")


def _neuron(chips: str) -> str:
    return (f"its AWS {chips} chips run models only through the AWS Neuron SDK, which "
            f"EagleNest's engines (vLLM on CUDA, the embedded PyTorch engine) do not use")


_ADVICE = "; choose a GPU type (g5, g6, g6e, p4d, p5 ...) or a CPU type (m5, c6i ...)."

#: family -> why it is refused
REFUSED_FAMILIES = {
    "inf1": _neuron("Inferentia"),
    "inf2": _neuron("Inferentia2"),
    "trn1": _neuron("Trainium"),
    "trn1n": _neuron("Trainium"),
    "trn2": _neuron("Trainium2"),
    "dl1": ("its Habana Gaudi accelerators need Intel's Gaudi software (SynapseAI), which "
            "EagleNest does not use"),
    # Kepler (sm_35/sm_37) left CUDA with 12.0; vLLM needs compute capability 7.0 or higher
    "p2": ("its NVIDIA K80 GPUs (Kepler, compute capability 3.7) are not supported by CUDA 12 "
           "or later, so neither by the CUDA builds of PyTorch nor by vLLM (compute "
           "capability 7.0 or higher)"),
}


def lookup(name: str) -> InstanceType:
    """The InstanceType `name` (``ml.g5.12xlarge``) stands for; UnsupportedInstanceType for a
    refused family or an unknown name."""
    prefix, _, rest = name.partition(".")
    family, _, size = rest.partition(".")
    if prefix == "ml" and family in REFUSED_FAMILIES:
        raise UnsupportedInstanceType(name, REFUSED_FAMILIES[family] + _ADVICE)
    if prefix == "ml" and family in GPU_FAMILIES:
        accelerator, memory, sizes = GPU_FAMILIES[family]
        if size in sizes:
            return InstanceType(name, sizes[size], float(memory), accelerator)
    if prefix == "ml" and family in CPU_FAMILIES and _CPU_SIZE.match(size):
        return InstanceType(name, 0, 0.0, "")
    raise UnsupportedInstanceType(
        name, "it is not an instance type EagleNest knows (docs/instance-types.md lists the "
              "families it serves)" + _ADVICE)
