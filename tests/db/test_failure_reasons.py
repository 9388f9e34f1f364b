"""FailureReason carries the cause in one line (issue #51, part 5): never a traceback, a
host path or another account's name, whoever writes it (db/repository.failure_reason, where
every status is set); the reason in full goes to the worker's log."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from eaglenest.db import endpoints_repo
from eaglenest.db import optimization_jobs_repo as jobs
from eaglenest.db.session import Database
from eaglenest.foundation.failure_reason import MAX_CHARS, first_exception, one_line
from eaglenest.workers.model_servers.process import ServerProcess, ServerSpec, ServingError
from tests.db.test_optimization_jobs_repo import ACCOUNT, JOB, make
from tests.support.endpoint_rows import EP, seed_endpoint

MINE = ACCOUNT.account_id
THEIRS = "222222222222"
#: what a model server printed before it exited (its log's end, as ServingError carried it)
SERVER_LOG = f"""INFO 01-01 10:00:00 loading /srv/eaglenest/jobs/{MINE}/j/model
Traceback (most recent call last):
  File "/srv/eaglenest/.venv/lib/python3.11/site-packages/eaglenest/models/target.py", \
line 88, in load
    raise TargetError(f"unknown architecture {{name}}")
eaglenest.models.target.TargetError: unknown architecture NoSuchForCausalLM

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/srv/eaglenest/eaglenest/workers/model_servers/embedded.py", line 12, in main
RuntimeError: the server could not start
"""


def test_a_traceback_becomes_its_cause_in_one_line() -> None:
    reason = f"embedded server exited with code 1: {SERVER_LOG}"
    assert one_line(reason, MINE) == ("embedded server exited with code 1: INFO 01-01 "
                                      "10:00:00 loading model: unknown architecture "
                                      "NoSuchForCausalLM")
    assert first_exception(SERVER_LOG) == "TargetError: unknown architecture NoSuchForCausalLM"
    assert one_line("KeyError: 'x'") == "KeyError: 'x'"  # a message too short alone


@pytest.mark.parametrize(("reason", "stored"), [
    ("Internal error: FileNotFoundError: [Errno 2] No such file or directory: "
     f"'/srv/eaglenest/jobs/{MINE}/j/model/config.json'",
     "Internal error: FileNotFoundError: [Errno 2] No such file or directory: 'config.json'"),
    ("Variant AllTraffic: s3://models/corrupt/model.tar.gz: model.tar.gz is not a readable "
     ".tar.gz archive", None),  # the caller's own S3 URI stays
    ("the model server did not answer /health within 60 s at http://127.0.0.1:8080/v1", None),
    (f"the GPUs are held by arn:aws:sagemaker:us-east-1:{THEIRS}:endpoint/their-secret-name "
     f"of account {THEIRS}",
     "the GPUs are held by another account's resource of another account"),
    (f"arn:aws:sagemaker:us-east-1:{MINE}:model/mine is gone", None),
    ("x" * 5000, "x" * MAX_CHARS),
])
def test_what_is_stored(reason: str, stored: str | None) -> None:
    assert one_line(reason, MINE) == (reason if stored is None else stored)


def test_every_writer_stores_one_line_and_logs_the_rest(db: Database,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """Before: the model server's log (a traceback, host paths) was the FailureReason."""
    reason = f"embedded server exited with code 1: {SERVER_LOG}"
    make(db)
    with db.session() as s:
        jobs.claim(s, JOB, "w1")
    with caplog.at_level(logging.WARNING, logger="eaglenest.failure"), db.session() as s:
        assert jobs.fail(s, JOB, "w1", reason)
    with db.session() as s:
        stored = jobs.get(s, "job").failure_reason
    assert stored is not None
    assert "\n" not in stored and "/srv/" not in stored and "Traceback" not in stored
    assert stored.endswith(": unknown architecture NoSuchForCausalLM")
    assert any(SERVER_LOG in r.getMessage() for r in caplog.records)  # in full, logged
    with db.session() as s:
        seed_endpoint(s)
    with db.session() as s:
        endpoints_repo.mark_failed(s, EP, reason)
    with db.session() as s:
        assert endpoints_repo.get(s, ACCOUNT, "ep").failure_reason == stored


def test_a_model_server_that_exits_names_the_cause(tmp_path: Path) -> None:
    """ServingError carries the first exception the server printed, not its log's end."""
    log = tmp_path / "server.log"
    earlier = "Traceback (most recent call last):\nValueError: an earlier launch's own error\n"
    log.write_text(earlier + SERVER_LOG)  # a restarted instance appends to its log
    server = ServerProcess(ServerSpec(model_dir=tmp_path, served_name="m", port=1,
                                      backend="embedded"), log)
    server.log_start = len(earlier)  # what launch() records
    message = server.failed("the model server (embedded) exited with code 1")
    assert message == ("the model server (embedded) exited with code 1: unknown "
                       "architecture NoSuchForCausalLM")
    assert str(ServingError(message)) == one_line(message, MINE)
