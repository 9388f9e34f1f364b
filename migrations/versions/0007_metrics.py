"""metric_series and metric_minutes: the per-account, per-minute metric store

A series is one account's (namespace, metric name, dimensions), unique; each minute of it
with data is one metric_minutes row (sample count, sum, minimum, maximum and a histogram of
fixed log-spaced buckets), keyed by (series, minute). db/metrics_repo.py reads and writes
them; rows older than Settings.metrics_retention_days are swept.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metric_series",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("account_id", sa.String(12), nullable=False),
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("dimensions", sa.String(1024), nullable=False),
        sa.Column("unit", sa.String(32), nullable=False),
        sa.Column("last_time", sa.Float(), nullable=False),
        sa.UniqueConstraint("account_id", "namespace", "name", "dimensions",
                            name="uq_metric_series_key"),
    )
    op.create_index("ix_metric_series_namespace", "metric_series", ["namespace", "last_time"])
    op.create_index("ix_metric_series_last_time", "metric_series", ["last_time"])
    op.create_table(
        "metric_minutes",
        sa.Column("series_id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("minute", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("sample_count", sa.Float(), nullable=False),
        sa.Column("sum", sa.Float(), nullable=False),
        sa.Column("minimum", sa.Float(), nullable=False),
        sa.Column("maximum", sa.Float(), nullable=False),
        sa.Column("histogram", sa.JSON(), nullable=False),
    )
    op.create_index("ix_metric_minutes_minute", "metric_minutes", ["minute"])


def downgrade() -> None:
    op.drop_index("ix_metric_minutes_minute", table_name="metric_minutes")
    op.drop_table("metric_minutes")
    op.drop_index("ix_metric_series_last_time", table_name="metric_series")
    op.drop_index("ix_metric_series_namespace", table_name="metric_series")
    op.drop_table("metric_series")
