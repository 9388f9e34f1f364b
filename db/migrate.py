"""Apply Alembic migrations programmatically (used by `eaglenest up/api/worker/migrate`)."""

from __future__ import annotations

from alembic import command
from alembic.config import Config

#: the migrations folder inside the installed package (alembic's `package:path` form), as in
#: alembic.ini
MIGRATIONS = "eaglenest:migrations"


def upgrade_head(database_url: str) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS)
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    command.upgrade(cfg, "head")
