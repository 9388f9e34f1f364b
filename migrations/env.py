"""Alembic environment: the URL comes from the caller's config or from Settings."""

from __future__ import annotations

from alembic import context

from eaglenest.db.session import make_engine
from eaglenest.db.tables import Base
from eaglenest.foundation.settings import Settings

config = context.config
url = config.get_main_option("sqlalchemy.url") or Settings().resolved_database_url()


def run() -> None:
    if context.is_offline_mode():
        context.configure(url=url, target_metadata=Base.metadata, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(url)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=Base.metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run()
