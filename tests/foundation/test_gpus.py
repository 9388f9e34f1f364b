"""A worker's GPU inventory (EAGLENEST_GPUS) and how a child is shown its GPUs."""

from __future__ import annotations

import pytest

from eaglenest.foundation.gpus import Gpu, GpuSpecError, inventory, visible_devices

SEEN = [Gpu(0, "A10G", 22.49), Gpu(1, "A10G", 22.49), Gpu(2, "A10G", 22.49)]


def test_empty_means_every_gpu_the_worker_sees() -> None:
    assert inventory("", SEEN) == SEEN
    assert inventory(None, []) == []


def test_none_means_no_gpu_even_where_there_are_some() -> None:
    assert inventory("none", SEEN) == [] and inventory(" NONE ", SEEN) == []


def test_indexes_restrict_to_those_gpus() -> None:
    assert inventory("2,0", SEEN) == [SEEN[0], SEEN[2]]


def test_a_declared_inventory_needs_no_gpu() -> None:
    assert inventory("4x24GiB", []) == [Gpu(i, "declared", 24.0) for i in range(4)]
    assert inventory("2x80GiB:H100", []) == [Gpu(0, "H100", 80.0), Gpu(1, "H100", 80.0)]


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
