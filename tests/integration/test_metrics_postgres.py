"""The metric store (db/metrics_repo.py) on PostgreSQL: concurrent writers of the same
series-minutes and of new series (tests/db/metrics_checks.py; the same checks run on SQLite
in tests/db/test_metrics_repo.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from eaglenest.db.migrate import upgrade_head
from eaglenest.db.session import Database
from tests.db.metrics_checks import check_concurrent_writers, check_series_limit_under_race
from tests.integration.conftest import Postgres


@pytest.fixture(scope="module")
def db(postgres_server: Postgres) -> Iterator[Database]:
    url = postgres_server.create_database(f"metrics_{uuid.uuid4().hex[:8]}")
    upgrade_head(url)
    d = Database(url)
    yield d
    d.dispose()


def test_concurrent_writers(db: Database) -> None:
    check_concurrent_writers(db)


def test_series_limit_under_concurrent_writers(db: Database) -> None:
    check_series_limit_under_race(db)
