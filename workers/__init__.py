"""Celery workers, process supervision and the `eaglenest` CLI."""
