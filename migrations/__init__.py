"""Alembic migrations. `alembic upgrade head` (or `eaglenest migrate`) applies them."""
