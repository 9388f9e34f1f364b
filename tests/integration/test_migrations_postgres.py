"""The migrations on PostgreSQL: they build what db/tables.py declares, and 0005 finds and
drops 0001's unnamed UNIQUE(name_key) on a database that has rows."""

from __future__ import annotations

import uuid

from tests.db.migration_checks import check_names_per_account, metadata_diff, upgrade
from tests.integration.conftest import Postgres


def test_migrations_match_the_tables(postgres_server: Postgres) -> None:
    url = postgres_server.create_database(f"fresh_{uuid.uuid4().hex[:8]}")
    upgrade(url)
    assert metadata_diff(url) == []


def test_names_unique_per_account_after_upgrade(postgres_server: Postgres) -> None:
    check_names_per_account(postgres_server.create_database(f"up_{uuid.uuid4().hex[:8]}"))
