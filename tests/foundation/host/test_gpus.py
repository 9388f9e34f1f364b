"""A worker's GPU inventory (EAGLENEST_GPUS), what it detects under the operator's
CUDA_VISIBLE_DEVICES (a stand-in nvidia-smi on PATH), and how a child is shown its GPUs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eaglenest.foundation.host import gpus as gpus_module
from eaglenest.foundation.host.gpus import (
    Gpu,
    GpuSpecError,
    Physical,
    cuda_view,
    detect,
    inventory,
    visible_devices,
)

SEEN = [Gpu(0, "A10G", 22.49), Gpu(1, "A10G", 22.49), Gpu(2, "A10G", 22.49)]
UUIDS = [f"GPU-{i}a1b2c3d-0000-1111-2222-33334444555{i}" for i in range(4)]
#: nvidia-smi --query-gpu=index,uuid,name,memory.total,compute_cap: four GPUs, two kinds
ROWS = [(0, "NVIDIA L4", 23034, "8.9"), (1, "NVIDIA L4", 23034, "8.9"),
        (2, "NVIDIA A100-SXM4-80GB", 81920, "8.0"), (3, "NVIDIA H100 80GB HBM3", 81559, "9.0")]


def test_empty_means_every_gpu_the_worker_sees() -> None:
    assert inventory("", SEEN) == SEEN
    assert inventory(None, []) == []


def test_none_means_no_gpu_even_where_there_are_some() -> None:
    assert inventory("none", SEEN) == [] and inventory(" NONE ", SEEN) == []


def test_indexes_restrict_to_those_gpus() -> None:
    assert inventory("2,0", SEEN) == [SEEN[0], SEEN[2]]


def test_a_declared_inventory_needs_no_gpu() -> None:
    assert inventory("4x24GiB", []) == [Gpu(i, "declared", 24.0) for i in range(4)]
    assert inventory("2x80GiB:H100", []) == [Gpu(0, "H100", 80.0, 9.0), Gpu(1, "H100", 80.0, 9.0)]
    assert [g.capability for g in inventory("1x24GiB:A10G", [])] == [8.6]
    assert [g.capability for g in inventory("1x24GiB:Mystery", [])] == [None]


@pytest.mark.parametrize("spec, message", [
    ("3", "names GPU 3, but this worker sees 3 GPU(s)"),
    ("0,x", "must be empty, 'none', GPU indexes such as '0,1', or a declared inventory"),
    ("4x", "must be empty, 'none', GPU indexes"),
    ("0x24GiB", "1 to 64 declared GPUs"),
    ("65x24GiB", "1 to 64 declared GPUs"),
])
def test_a_bad_spec_is_refused_naming_the_variable(spec: str, message: str) -> None:
    with pytest.raises(GpuSpecError) as exc:
        inventory(spec, SEEN)
    assert str(exc.value).startswith(f"EAGLENEST_GPUS={spec!r}") and message in str(exc.value)


def test_a_type_fits_a_gpu_that_reports_a_little_less_than_its_name_says() -> None:
    assert Gpu(0, "A10G", 22.49).fits(24) and Gpu(0, "H100", 79.1).fits(80)
    assert not Gpu(0, "T4", 14.6).fits(24) and not Gpu(0, "A100", 39.4).fits(80)


def test_children_see_their_gpus_through_the_workers_own_view() -> None:
    assert visible_devices([0, 2], {}) == "0,2"
    # the operator gave the worker physical GPUs 4..7: its index 1 is physical GPU 5
    assert visible_devices([1, 3], {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == "5,7"
    assert visible_devices([], {"CUDA_VISIBLE_DEVICES": "4,5"}) == ""


def test_a_gpu_stored_without_its_capability_reads_back() -> None:
    assert Gpu.from_dict({"index": 1, "name": "A10G", "memory_gib": 22.49}) == \
        Gpu(1, "A10G", 22.49, None)
    gpu = Gpu(0, "H100", 79.1, 9.0)
    assert Gpu.from_dict(gpu.to_dict()) == gpu and gpu.to_dict()["capability"] == 9.0


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in nvidia-smi first on PATH that prints ROWS (without compute_cap, or refusing
    the field when $FAKE_SMI_OLD is set, as an old nvidia-smi does); torch is never asked
    unless a test says so."""
    lines = "\n".join(f"{i}, {UUIDS[i]}, {name}, {mib}" for i, name, mib, _ in ROWS)
    with_cap = "\n".join(f"{i}, {UUIDS[i]}, {name}, {mib}, {cap}" for i, name, mib, cap in ROWS)
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"""#!/bin/sh
echo "$@" >> "{tmp_path}/calls"
case "$*" in
  *compute_cap*)
    if [ -n "$FAKE_SMI_OLD" ]; then
      echo 'Field "compute_cap" is not a valid field to query.' >&2; exit 2
    fi
    printf '%s\\n' "{with_cap}" ;;
  *) printf '%s\\n' "{lines}" ;;
esac
""")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.delenv("FAKE_SMI_OLD", raising=False)

    def no_torch(environ: object) -> list[Gpu]:
        raise AssertionError("torch was asked although nvidia-smi's numbering is CUDA's")

    monkeypatch.setattr(gpus_module, "_torch_child", no_torch)
    return tmp_path


def test_the_worker_holds_only_the_gpus_its_cuda_visible_devices_gives(
        smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # nvidia-smi's order is CUDA's
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    got = inventory("")
    assert got == [Gpu(0, "NVIDIA A100-SXM4-80GB", 80.0, 8.0),
                   Gpu(1, "NVIDIA H100 80GB HBM3", 79.65, 9.0)]
    assert visible_devices([g.index for g in got]) == "2,3"
    assert visible_devices([1]) == "3"
    # EAGLENEST_GPUS indexes are the worker's own: 1 is physical GPU 3
    assert inventory("1") == [got[1]]
    with pytest.raises(GpuSpecError, match="names GPU 2, but this worker sees 2 GPU"):
        inventory("2")


def test_gpus_given_by_uuid_even_abbreviated_are_mapped_back_as_given(
        smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    given = f"{UUIDS[3]},{UUIDS[1][:12]}"  # GPU-3a1b2c3d (whole), GPU-1a1b2c3 (a prefix)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", given)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    got = detect()
    assert [(g.index, g.name, g.capability) for g in got] == [
        (0, "NVIDIA H100 80GB HBM3", 9.0), (1, "NVIDIA L4", 8.9)]
    assert visible_devices([0, 1]) == given and visible_devices([1]) == UUIDS[1][:12]


def test_unset_is_every_gpu_and_empty_is_none(smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert [(g.index, g.memory_gib) for g in detect()] == [
        (0, 22.49), (1, 22.49), (2, 80.0), (3, 79.65)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert detect() == [] and inventory("") == []


def test_an_old_nvidia_smi_without_compute_cap_still_serves(
        smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    monkeypatch.setenv("FAKE_SMI_OLD", "1")
    assert detect() == [Gpu(0, "NVIDIA L4", 22.49), Gpu(1, "NVIDIA L4", 22.49)]
    calls = (smi / "calls").read_text().splitlines()
    assert len(calls) == 2 and "compute_cap" in calls[0] and "compute_cap" not in calls[1]


def test_nvidia_smis_order_is_cudas_for_like_gpus_or_by_pci_bus_id() -> None:
    like = [Physical(i, UUIDS[i], Gpu(i, "NVIDIA L4", 22.49, 8.9)) for i in range(3)]
    got, exact = cuda_view(like, {"CUDA_VISIBLE_DEVICES": "2,0"})
    assert exact and got == [Gpu(0, "NVIDIA L4", 22.49, 8.9), Gpu(1, "NVIDIA L4", 22.49, 8.9)]
    unlike = [*like[:2], Physical(2, UUIDS[2], Gpu(2, "NVIDIA H100", 79.1, 9.0))]
    assert not cuda_view(unlike, {"CUDA_VISIBLE_DEVICES": "0"})[1]  # H100 may be CUDA's 0
    assert cuda_view(unlike, {"CUDA_VISIBLE_DEVICES": "2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
                     ) == ([Gpu(0, "NVIDIA H100", 79.1, 9.0)], True)
    assert cuda_view(like, {"CUDA_VISIBLE_DEVICES": "1,1"}) == (
        [Gpu(0, "NVIDIA L4", 22.49, 8.9)], False)  # a repeat: CUDA itself is asked


def test_unlike_gpus_or_an_entry_nvidia_smi_cannot_map_ask_cuda_itself(
        smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str | None] = []

    def torch_child(environ: dict[str, str]) -> list[Gpu]:
        asked.append(environ.get("CUDA_VISIBLE_DEVICES"))
        return [Gpu(0, "from torch", 79.0, 9.0)]

    monkeypatch.setattr(gpus_module, "_torch_child", torch_child)
    # FASTEST_FIRST (CUDA's default) over unlike GPUs: nvidia-smi's order may not be CUDA's
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert detect() == [Gpu(0, "from torch", 79.0, 9.0)] and asked == ["2,3"]
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,MIG-1234")
    assert detect()[0].name == "from torch" and asked == ["2,3", "0,MIG-1234"]
    monkeypatch.setattr(gpus_module, "_torch_child", lambda environ: [])
    # torch cannot tell: CUDA's rule, the list ends at the entry that names no GPU
    assert [g.name for g in detect()] == ["NVIDIA L4"]
