"""Persistence: SQLAlchemy 2.0 tables, sessions and repository functions."""
