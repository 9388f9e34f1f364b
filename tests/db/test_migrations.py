"""The migrations on SQLite: they build what db/tables.py declares, and 0005 makes names
unique per account on a database that has rows (tests/integration: the same on
PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

from tests.db.migration_checks import check_names_per_account, metadata_diff, upgrade


def test_migrations_match_the_tables(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    upgrade(url)
    assert metadata_diff(url) == []


def test_names_unique_per_account_after_upgrade(tmp_path: Path) -> None:
    check_names_per_account(f"sqlite:///{tmp_path / 'from-0004.db'}")
