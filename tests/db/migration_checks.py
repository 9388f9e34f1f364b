"""Checks of the migrations on a database URL, shared by the SQLite tests (tests/db) and
the PostgreSQL ones (tests/integration)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy.exc import IntegrityError

from eaglenest.db.migrate import MIGRATIONS
from eaglenest.db.session import make_engine
from eaglenest.db.tables import Base

TABLES = ("models", "endpoint_configs", "endpoints", "optimization_jobs")
KINDS = {"models": "model", "endpoint_configs": "endpoint-config", "endpoints": "endpoint",
         "optimization_jobs": "optimization-job"}
A, B = "000000000000", "111111111111"


def upgrade(url: str, revision: str = "head") -> None:
    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS)
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    command.upgrade(cfg, revision)


def metadata_diff(url: str) -> list[Any]:
    """What autogenerate would change to make the migrated database match db/tables.py."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return list(compare_metadata(MigrationContext.configure(conn), Base.metadata))
    finally:
        engine.dispose()


def row(table: str, account: str, name: str, **extra: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "name": name, "name_key": name.lower(), "account_id": account, "creation_time": 1.0,
        "arn": f"arn:aws:sagemaker:us-east-1:{account}:{KINDS[table]}/{name.lower()}",
        "spec": {}, "tags": []}
    if table == "endpoints":
        values.update(status="InService", config_name="c", last_modified_time=1.0,
                      deployment={})
    if table == "optimization_jobs":
        values.update(status="STARTING", last_modified_time=1.0, optimization_types="",
                      output={})
    return {**values, **extra}


def _insert(conn: sa.Connection, table: str, values: dict[str, Any]) -> None:
    t = sa.Table(table, sa.MetaData(), autoload_with=conn)
    conn.execute(t.insert().values(**values))


def check_names_per_account(url: str) -> None:
    """0004 with rows in it -> head: the rows stay; the same name in another account is
    accepted, in the same account (any case) refused, and so is a second row of one ARN."""
    upgrade(url, "0004")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            for table in TABLES:
                _insert(conn, table, row(table, A, "Shared"))
        upgrade(url)
        for table in TABLES:
            with engine.begin() as conn:
                _insert(conn, table, row(table, B, "shared"))
            for dup in (row(table, A, "SHARED", arn=f"arn:{table}:other"),
                        row(table, B, "other", arn=row(table, A, "shared")["arn"])):
                with pytest.raises(IntegrityError), engine.begin() as conn:
                    _insert(conn, table, dup)
            with engine.connect() as conn:
                t = sa.Table(table, sa.MetaData(), autoload_with=conn)
                got = conn.execute(sa.select(t.c.account_id, t.c.name).order_by(t.c.id)).all()
            assert [tuple(r) for r in got] == [(A, "Shared"), (B, "shared")], table
    finally:
        engine.dispose()
    assert metadata_diff(url) == []
