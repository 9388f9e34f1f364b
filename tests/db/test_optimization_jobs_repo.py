"""The job state machine, on a real SQLite database migrated with Alembic. Workers name a job
by its ARN; two accounts' jobs of one name are two jobs."""

from __future__ import annotations

import pytest

from eaglenest.db import optimization_jobs_repo as jobs
from eaglenest.db.session import Database
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.errors import ResourceInUse, ResourceNotFound, ValidationException

ACCOUNT = Account("us-east-1", "123456789012")
OTHER = Account("us-east-1", "222222222222")


def job_arn(name: str, account: Account = ACCOUNT) -> str:
    return account.arn("optimization-job", name)


JOB = job_arn("job")
SPEC = {
    "OptimizationJobName": "job", "RoleArn": "arn:aws:iam::123456789012:role/r",
    "ModelSource": {"S3": {"S3Uri": "s3://b/m/"}}, "DeploymentInstanceType": "ml.g5.2xlarge",
    "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
    "OutputConfig": {"S3OutputLocation": "s3://b/o/"},
    "StoppingCondition": {"MaxRuntimeInSeconds": 60},
}


def make(db: Database, name: str = "job", account: Account = ACCOUNT) -> None:
    with db.session() as s:
        jobs.create(s, account, {**SPEC, "OptimizationJobName": name})


def status(db: Database, name: str = "job") -> str:
    with db.session() as s:
        return jobs.get(s, name).status


def test_claim_complete(db):
    make(db)
    with db.session() as s:
        assert jobs.claim(s, JOB, "w1") is not None
    with db.session() as s:
        assert jobs.claim(s, JOB, "w2") is None  # already owned
        assert jobs.heartbeat(s, JOB, "w2") is None
        assert jobs.heartbeat(s, JOB, "w1") == jobs.INPROGRESS
    with db.session() as s:  # only the owner ends the job
        assert not jobs.complete(s, JOB, "w2", {"OptimizationOutput": {}})
        assert not jobs.fail(s, JOB, "w2", "not mine")
    assert status(db) == jobs.INPROGRESS
    with db.session() as s:
        assert jobs.complete(s, JOB, "w1", {"OptimizationOutput": {}})
    assert status(db) == jobs.COMPLETED
    with db.session() as s:  # completing twice changes nothing
        assert not jobs.complete(s, JOB, "w1", {"OptimizationOutput": {"again": 1}})
        assert not jobs.fail(s, JOB, "w1", "too late")
        row = jobs.get(s, "job")
        assert (row.status, row.output, row.failure_reason) == (
            jobs.COMPLETED, {"OptimizationOutput": {}}, None)


def test_a_worker_whose_lease_was_taken_over_cannot_end_the_job(db):
    make(db)
    with db.session() as s:
        jobs.claim(s, JOB, "paused")
    with db.session() as s:
        assert jobs.reclaim_lost(s, lease_seconds=0) == [JOB]
    with db.session() as s:
        assert jobs.claim(s, JOB, "new") is not None
    with db.session() as s:  # the paused worker wakes up and finishes its copy
        assert not jobs.complete(s, JOB, "paused", {"stale": True})
        assert not jobs.fail(s, JOB, "paused", "stale failure")
    with db.session() as s:
        row = jobs.get(s, "job")
        assert (row.status, row.owner, row.output) == (jobs.INPROGRESS, "new", {})


def test_two_claims_racing_on_a_stale_read_only_one_wins(db):
    """SQLite ignores FOR UPDATE: a session that read STARTING before another worker's claim
    committed must not take the job too (the compare-and-set UPDATE matches nothing)."""
    make(db)
    with db.session() as late:
        stale = jobs.get(late, "job")
        assert stale.status == jobs.STARTING  # read before the other worker's claim
        with db.session() as early:
            assert jobs.claim(early, JOB, "w1") is not None
        assert jobs.claim(late, JOB, "w2") is None
    with db.session() as s:
        row = jobs.get(s, "job")
        assert (row.status, row.owner) == (jobs.INPROGRESS, "w1")


def test_stop_owned_job_waits_for_worker(db):
    make(db)
    with db.session() as s:
        jobs.claim(s, JOB, "w1")
    with db.session() as s:
        jobs.request_stop(s, "job", lease_seconds=60)
    assert status(db) == jobs.STOPPING
    with db.session() as s, pytest.raises(ValidationException):
        jobs.request_delete(s, "job", lease_seconds=60)
    with db.session() as s:
        assert not jobs.acknowledge_stop(s, JOB, "w2")
        assert jobs.acknowledge_stop(s, JOB, "w1")
    assert status(db) == jobs.STOPPED


def test_dead_owner_is_reclaimed(db):
    make(db, "a")
    make(db, "b")
    with db.session() as s:
        jobs.claim(s, job_arn("a"), "dead-worker")
        jobs.claim(s, job_arn("b"), "dead-worker")
    with db.session() as s:
        jobs.request_stop(s, "b", lease_seconds=60)
    with db.session() as s:
        names = jobs.reclaim_lost(s, lease_seconds=0)
    assert names == [job_arn("a")]
    assert (status(db, "a"), status(db, "b")) == (jobs.STARTING, jobs.STOPPED)


def test_errors(db):
    make(db)
    with db.session() as s, pytest.raises(ResourceInUse):
        jobs.create(s, ACCOUNT, dict(SPEC))
    with db.session() as s, pytest.raises(ResourceNotFound):
        jobs.get(s, "missing")
    with db.session() as s:
        jobs.claim(s, JOB, "w1")
    with db.session() as s:
        assert jobs.fail(s, JOB, "w1", "bad data at line 3")
    with db.session() as s, pytest.raises(ValidationException):
        jobs.request_stop(s, "job", lease_seconds=60)
    with db.session() as s:
        row = jobs.get(s, "job")
        assert (row.status, row.failure_reason) == (jobs.FAILED, "bad data at line 3")
        assert row.end_time is not None


def test_two_accounts_jobs_of_one_name_are_two_jobs(db):
    make(db)
    make(db, account=OTHER)
    with db.session() as s, pytest.raises(ResourceInUse, match="Optimization job JOB already"):
        jobs.create(s, OTHER, {**SPEC, "OptimizationJobName": "JOB"})
    with db.session() as s:
        assert jobs.claim(s, "job", "w1") is None  # a bare name both accounts have: neither
        assert jobs.claim(s, job_arn("job", OTHER), "w2") is not None
        assert jobs.heartbeat(s, JOB, "w2") is None
        assert jobs.complete(s, job_arn("job", OTHER), "w2", {"done": 1})
    with db.session() as s:
        mine, theirs = jobs.get(s, JOB), jobs.get(s, "job", account=OTHER)
        assert (mine.status, mine.owner, mine.output) == (jobs.STARTING, None, {})
        assert (theirs.status, theirs.output) == (jobs.COMPLETED, {"done": 1})
        assert jobs.pending(s) == [JOB]
