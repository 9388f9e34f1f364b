"""SQLAlchemy 2.0 tables. Times are epoch seconds (float): portable and index-friendly.

Each row keeps the caller's request members verbatim in `spec` (JSON) so Describe returns
every member botocore defines, and the columns the API filters or sorts on alongside.
`name_key` is the lower-cased name: ARNs are lower-cased, so names are unique ignoring case
within an account (two accounts may use one name, as in AWS); `arn` names the account too
and is unique, which is how workers find a row.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class _Named:
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63), nullable=False)
    name_key: Mapped[str] = mapped_column(String(63), nullable=False)
    #: the account of the key that created it: only that account's requests find it
    account_id: Mapped[str] = mapped_column(String(12), nullable=False)
    arn: Mapped[str] = mapped_column(String(256), nullable=False)
    creation_time: Mapped[float] = mapped_column(Float, nullable=False)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    tags: Mapped[list[dict[str, str]]] = mapped_column(JSON, nullable=False, default=list)


def _named_args(table: str, *more: Index) -> tuple[Any, ...]:
    """Every resource table's constraints and indexes (migrations 0001, 0004, 0005)."""
    return (
        UniqueConstraint("account_id", "name_key", name=f"uq_{table}_account_name"),
        Index(f"ux_{table}_arn", "arn", unique=True),
        Index(f"ix_{table}_account", "account_id", "creation_time", "id"),
        Index(f"ix_{table}_ctime", "creation_time", "id"),
        *more,
    )


class ModelRow(_Named, Base):
    __tablename__ = "models"
    __table_args__ = _named_args("models")


class EndpointConfigRow(_Named, Base):
    __tablename__ = "endpoint_configs"
    __table_args__ = _named_args("endpoint_configs")


class EndpointRow(_Named, Base):
    __tablename__ = "endpoints"
    __table_args__ = _named_args("endpoints", Index("ix_endpoints_status", "status", "id"))

    status: Mapped[str] = mapped_column(String(32), nullable=False)
    config_name: Mapped[str] = mapped_column(String(63), nullable=False)
    pending_config_name: Mapped[str | None] = mapped_column(String(63), nullable=True)
    failure_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    last_modified_time: Mapped[float] = mapped_column(Float, nullable=False)
    #: what the serving backend reported (variants, addresses); empty until deployed
    deployment: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False, default=dict)
    #: the worker running the endpoint's current transition ("host:pid") and its last
    #: heartbeat, or None (no transition, or its task not yet picked up)
    owner: Mapped[str | None] = mapped_column(String(256), nullable=True)
    heartbeat_time: Mapped[float | None] = mapped_column(Float, nullable=True)


class OptimizationJobRow(_Named, Base):
    __tablename__ = "optimization_jobs"
    __table_args__ = _named_args(
        "optimization_jobs", Index("ix_optimization_jobs_status", "status", "id"))

    status: Mapped[str] = mapped_column(String(32), nullable=False)
    failure_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    last_modified_time: Mapped[float] = mapped_column(Float, nullable=False)
    start_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    end_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    optimization_types: Mapped[str] = mapped_column(String(256), nullable=False, default="")
    output: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False, default=dict)
    #: the worker that runs the job ("host:pid") and its last heartbeat, or None
    owner: Mapped[str | None] = mapped_column(String(256), nullable=True)
    heartbeat_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: what the running job is doing (stage; step, total, loss, accuracy, tokens/s, ETA in
    #: training), written by its worker for `eaglenest status`; no API shape returns it
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class WorkerRow(Base):
    """A running worker and the GPUs it may place work on (db/placement_repo.py)."""

    __tablename__ = "workers"

    #: the worker's identity as jobs and endpoints name their owner ("machine:pid")
    owner: Mapped[str] = mapped_column(String(256), primary_key=True)
    #: the host name GPUs are placed on (EAGLENEST_HOST_NAME); workers sharing GPUs share it
    host: Mapped[str] = mapped_column(String(128), nullable=False, index=True)
    #: the process beyond its pid (foundation/host/children.Identity): machine, boot, pid, start
    machine: Mapped[str] = mapped_column(String(256), nullable=False)
    boot: Mapped[str] = mapped_column(String(64), nullable=False)
    pid: Mapped[int] = mapped_column(Integer, nullable=False)
    pid_start: Mapped[int] = mapped_column(BigInteger, nullable=False)
    queues: Mapped[str] = mapped_column(String(256), nullable=False)
    #: [{"index", "name", "memory_gib"}] (foundation/host/gpus.Gpu)
    gpus: Mapped[list[dict[str, Any]]] = mapped_column(JSON, nullable=False, default=list)
    started_time: Mapped[float] = mapped_column(Float, nullable=False)
    heartbeat_time: Mapped[float] = mapped_column(Float, nullable=False)


class GpuHoldingRow(Base):
    """One GPU of one host held by one endpoint instance or job: at most one row per GPU."""

    __tablename__ = "gpu_holdings"
    __table_args__ = (UniqueConstraint("host", "gpu_index", name="uq_gpu_holdings_gpu"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    host: Mapped[str] = mapped_column(String(128), nullable=False)
    gpu_index: Mapped[int] = mapped_column(Integer, nullable=False)
    #: the ARN of the endpoint or job that holds it
    holder: Mapped[str] = mapped_column(String(256), nullable=False, index=True)
    #: which of the holder's processes ("<variant>-<fleet>-<instance>", or "job")
    unit: Mapped[str] = mapped_column(String(128), nullable=False)
    #: the worker (WorkerRow.owner) whose child processes use it
    owner: Mapped[str] = mapped_column(String(256), nullable=False)
    since: Mapped[float] = mapped_column(Float, nullable=False)


class MetricSeriesRow(Base):
    """One metric series of one account (db/metrics_repo.py): (namespace, name,
    dimensions) with the unit its data have; account "" holds service-wide series."""

    __tablename__ = "metric_series"
    __table_args__ = (
        UniqueConstraint("account_id", "namespace", "name", "dimensions",
                         name="uq_metric_series_key"),
        Index("ix_metric_series_namespace", "namespace", "last_time"),
        Index("ix_metric_series_last_time", "last_time"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(String(12), nullable=False)
    namespace: Mapped[str] = mapped_column(String(255), nullable=False)
    name: Mapped[str] = mapped_column(String(255), nullable=False)
    #: the (name, value) pairs sorted by name, as compact JSON: '[["EndpointName","e"],...]'
    dimensions: Mapped[str] = mapped_column(String(1024), nullable=False)
    #: the CloudWatch unit of every datum of the series (data of another unit are dropped)
    unit: Mapped[str] = mapped_column(String(32), nullable=False)
    #: the time (epoch seconds) of its latest datum
    last_time: Mapped[float] = mapped_column(Float, nullable=False)


class MetricMinuteRow(Base):
    """One series' data in one minute (db/metric_histogram.py): count, sum, extremes and
    the histogram of fixed log-spaced buckets ({bucket key: count}) percentiles come from."""

    __tablename__ = "metric_minutes"
    __table_args__ = (Index("ix_metric_minutes_minute", "minute"),)

    series_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    #: epoch seconds // 60
    minute: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    sample_count: Mapped[float] = mapped_column(Float, nullable=False)
    sum: Mapped[float] = mapped_column(Float, nullable=False)
    minimum: Mapped[float] = mapped_column(Float, nullable=False)
    maximum: Mapped[float] = mapped_column(Float, nullable=False)
    histogram: Mapped[dict[str, int]] = mapped_column(JSON, nullable=False)
