"""Repository tests' database: a migrated SQLite file per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eaglenest.db.migrate import upgrade_head
from eaglenest.db.session import Database


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    url = f"sqlite:///{tmp_path / 'repo.db'}"
    upgrade_head(url)
    d = Database(url)
    yield d
    d.dispose()
