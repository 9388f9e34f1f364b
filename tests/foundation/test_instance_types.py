"""foundation/instance_types.py: every instance type botocore lets a caller name maps to its
accelerators or is refused with a reason; the published counts and memory."""

from __future__ import annotations

import pickle

import botocore.session
import pytest

from eaglenest.foundation.instance_types import (
    REFUSED_FAMILIES,
    InstanceType,
    UnsupportedInstanceType,
    lookup,
)

ENUMS = ("ProductionVariantInstanceType", "OptimizationJobDeploymentInstanceType")


def _enum(shape: str) -> list[str]:
    model = botocore.session.get_session().get_service_model("sagemaker")
    return list(model.shape_for(shape).enum)


def _family(name: str) -> str:
    return name.split(".")[1]


@pytest.mark.parametrize("shape", ENUMS)
def test_every_botocore_value_maps_or_is_refused_with_a_reason(shape):
    """A value botocore adds lands here unmapped (an "is not an instance type EagleNest
    knows" refusal) until the table says what it is."""
    values = _enum(shape)
    assert len(values) > 40
    unknown = []
    for name in values:
        try:
            kind = lookup(name)
        except UnsupportedInstanceType as exc:
            assert str(exc).startswith(f"{name} is not supported by EagleNest: ")
            if _family(name) not in REFUSED_FAMILIES:
                unknown.append(name)
            continue
        assert kind.name == name
        assert (kind.accelerators == 0) == (kind.memory_gib == 0) == (kind.accelerator == "")
        assert kind.accelerators in (0, 1, 2, 4, 8)
    assert unknown == []


def test_refused_families_say_why():
    for name, words in [("ml.inf1.xlarge", "Neuron SDK"), ("ml.inf2.48xlarge", "Neuron SDK"),
                        ("ml.trn1.2xlarge", "Neuron SDK"), ("ml.trn1n.32xlarge", "Neuron SDK"),
                        ("ml.trn2.48xlarge", "Neuron SDK"), ("ml.dl1.24xlarge", "Gaudi"),
                        ("ml.p2.xlarge", "K80")]:
        with pytest.raises(UnsupportedInstanceType) as exc:
            lookup(name)
        assert str(exc.value).startswith(f"{name} is not supported by EagleNest: its ")
        assert words in str(exc.value)
        assert isinstance(exc.value, ValueError)
        assert exc.value.name == name


def test_unknown_names_are_refused():
    for name in ("ml.bogus.xlarge", "ml.g5.3xlarge", "ml.m5.huge", "g5.xlarge", "ml.g5", ""):
        with pytest.raises(UnsupportedInstanceType) as exc:
            lookup(name)
        assert str(exc.value) == (
            f"{name} is not supported by EagleNest: it is not an instance type EagleNest "
            "knows (docs/instance-types.md lists the families it serves); choose a GPU type "
            "(g5, g6, g6e, p4d, p5 ...) or a CPU type (m5, c6i ...).")


@pytest.mark.parametrize("name, count, memory, accelerator", [
    ("ml.g4dn.xlarge", 1, 16, "T4"), ("ml.g4dn.12xlarge", 4, 16, "T4"),
    ("ml.g4dn.16xlarge", 1, 16, "T4"),
    ("ml.g5.xlarge", 1, 24, "A10G"), ("ml.g5.16xlarge", 1, 24, "A10G"),
    ("ml.g5.12xlarge", 4, 24, "A10G"), ("ml.g5.24xlarge", 4, 24, "A10G"),
    ("ml.g5.48xlarge", 8, 24, "A10G"),
    ("ml.g6.2xlarge", 1, 24, "L4"), ("ml.g6.12xlarge", 4, 24, "L4"),
    ("ml.g6.48xlarge", 8, 24, "L4"),
    ("ml.g6e.xlarge", 1, 48, "L40S"), ("ml.g6e.24xlarge", 4, 48, "L40S"),
    ("ml.g6e.48xlarge", 8, 48, "L40S"),
    ("ml.g7e.8xlarge", 1, 96, "RTX PRO 6000 Blackwell"),
    ("ml.g7e.12xlarge", 2, 96, "RTX PRO 6000 Blackwell"),
    ("ml.g7e.48xlarge", 8, 96, "RTX PRO 6000 Blackwell"),
    ("ml.g7.12xlarge", 2, 32, "RTX PRO 4500 Blackwell"),
    ("ml.p3.2xlarge", 1, 16, "V100"), ("ml.p3.8xlarge", 4, 16, "V100"),
    ("ml.p3.16xlarge", 8, 16, "V100"), ("ml.p3dn.24xlarge", 8, 32, "V100"),
    ("ml.p4d.24xlarge", 8, 40, "A100"), ("ml.p4de.24xlarge", 8, 80, "A100"),
    ("ml.p5.4xlarge", 1, 80, "H100"), ("ml.p5.48xlarge", 8, 80, "H100"),
    ("ml.p5e.48xlarge", 8, 141, "H200"), ("ml.p5en.48xlarge", 8, 141, "H200"),
    ("ml.p6-b200.48xlarge", 8, 180, "B200"), ("ml.p6-b300.48xlarge", 8, 268, "B300"),
    ("ml.p6e-gb200.36xlarge", 4, 186, "GB200"),
])
def test_published_accelerators(name, count, memory, accelerator):
    assert lookup(name) == InstanceType(name, count, float(memory), accelerator)


@pytest.mark.parametrize("name", ["ml.t2.medium", "ml.m5.xlarge", "ml.c6i.32xlarge",
                                  "ml.r7i.48xlarge", "ml.c6in.large", "ml.m8g.medium",
                                  "ml.r7gd.16xlarge", "ml.c8g.48xlarge"])
def test_cpu_types_have_no_accelerators(name):
    assert lookup(name) == InstanceType(name, 0, 0.0, "")


def test_instance_type_is_frozen_and_refusal_pickles():
    kind = lookup("ml.g5.2xlarge")
    with pytest.raises(AttributeError):
        kind.accelerators = 2  # type: ignore[misc]
    exc = pickle.loads(pickle.dumps(UnsupportedInstanceType("ml.p2.xlarge", "old")))
    assert (str(exc), exc.name, exc.reason) == (
        "ml.p2.xlarge is not supported by EagleNest: old", "ml.p2.xlarge", "old")
