"""CreateOptimizationJob refuses a block head's options (EAGLENEST_DFLASH_BLOCK_SIZE,
EAGLENEST_DFLASH_LAYERS, EAGLENEST_DFLASH_GAMMA) with the worker's own words, through boto3
and the real API: an AWS-shaped ValidationException naming the variable, and no job stored."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from eaglenest.workers.jobs.options import OptionError, parse_options
from tests.api.sagemaker.test_optimization_jobs import err, job_args

#: the block head kind (models/heads/registry.py HeadSpec.block)
BLOCK = "dflash"

BAD = [
    ("EAGLENEST_DFLASH_BLOCK_SIZE", "1", "EAGLENEST_DFLASH_BLOCK_SIZE=1 must be between 2 and 16"),
    ("EAGLENEST_DFLASH_BLOCK_SIZE", "17",
     "EAGLENEST_DFLASH_BLOCK_SIZE=17 must be between 2 and 16"),
    ("EAGLENEST_DFLASH_BLOCK_SIZE", "eight",
     "EAGLENEST_DFLASH_BLOCK_SIZE='eight' is not an integer"),
    ("EAGLENEST_DFLASH_LAYERS", "0", "EAGLENEST_DFLASH_LAYERS=0 must be between 1 and 8"),
    ("EAGLENEST_DFLASH_LAYERS", "9", "EAGLENEST_DFLASH_LAYERS=9 must be between 1 and 8"),
    ("EAGLENEST_DFLASH_GAMMA", "0", "EAGLENEST_DFLASH_GAMMA='0' must be a number above 0 and "
                                    "at most 64"),
    ("EAGLENEST_DFLASH_GAMMA", "-2", "EAGLENEST_DFLASH_GAMMA='-2' must be a number above 0 and "
                                     "at most 64"),
    ("EAGLENEST_DFLASH_GAMMA", "65", "EAGLENEST_DFLASH_GAMMA='65' must be a number above 0 and "
                                     "at most 64"),
    ("EAGLENEST_DFLASH_GAMMA", "nan", "EAGLENEST_DFLASH_GAMMA='nan' is not a finite number"),
    ("EAGLENEST_DFLASH_GAMMA", "inf", "EAGLENEST_DFLASH_GAMMA='inf' is not a finite number"),
]


@pytest.mark.parametrize(("name", "value", "words"), BAD)
def test_bad_block_head_options_are_refused_at_create_naming_the_variable(
        sm, unique, name: str, value: str, words: str) -> None:
    env = {"EAGLENEST_HEAD": BLOCK, name: value}
    with pytest.raises(OptionError) as worker:  # the worker's own reading
        parse_options(env)
    assert str(worker.value) == words
    with pytest.raises(ClientError) as exc:
        sm.create_optimization_job(OptimizationJobName=unique,
                                   **job_args(OptimizationEnvironment=env))
    assert err(exc) == ("ValidationException", f"OptimizationEnvironment: {words} (EagleNest's "
                                                f"limits: docs/configuration.md).")
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    with pytest.raises(ClientError) as gone:
        sm.describe_optimization_job(OptimizationJobName=unique)
    assert err(gone)[0] == "ResourceNotFound"


def test_good_block_head_options_are_accepted_and_kept(sm, unique) -> None:
    env = {"EAGLENEST_HEAD": BLOCK, "EAGLENEST_DFLASH_BLOCK_SIZE": "16",
           "EAGLENEST_DFLASH_LAYERS": "8", "EAGLENEST_DFLASH_GAMMA": "64"}
    sm.create_optimization_job(OptimizationJobName=unique,
                               **job_args(OptimizationEnvironment=env))
    d = sm.describe_optimization_job(OptimizationJobName=unique)
    assert d["OptimizationEnvironment"] == env
    opts = parse_options(env)
    assert (opts.dflash_block_size, opts.dflash_layers, opts.dflash_gamma) == (16, 8, 64.0)
