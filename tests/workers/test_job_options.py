"""OptimizationEnvironment parsing: values become JobOptions; a bad one names the variable
and its constraint (the job then fails with that message as FailureReason)."""

from __future__ import annotations

import pytest

from workers.job_options import OptionError, parse_options


def test_train_processes_is_read_and_defaults_to_the_worker_setting() -> None:
    assert parse_options({"EAGLENEST_TRAIN_PROCESSES": "4"}).train_processes == 4
    assert parse_options({}).train_processes is None  # the worker's setting decides


@pytest.mark.parametrize(("raw", "message"), [
    ("0", "EAGLENEST_TRAIN_PROCESSES=0 must be between 1 and 64"),
    ("65", "EAGLENEST_TRAIN_PROCESSES=65 must be between 1 and 64"),
    ("two", "EAGLENEST_TRAIN_PROCESSES='two' is not an integer"),
])
def test_bad_train_processes_names_the_variable(raw: str, message: str) -> None:
    with pytest.raises(OptionError) as exc:
        parse_options({"EAGLENEST_TRAIN_PROCESSES": raw})
    assert str(exc.value) == message
