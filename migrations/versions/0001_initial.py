"""initial tables: models, endpoint_configs, endpoints, optimization_jobs

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _named(table: str, *extra: sa.Column) -> None:
    op.create_table(
        table,
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("name_key", sa.String(63), nullable=False, unique=True),
        sa.Column("arn", sa.String(256), nullable=False),
        sa.Column("creation_time", sa.Float(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        *extra,
    )
    op.create_index(f"ix_{table}_ctime", table, ["creation_time", "id"])


def upgrade() -> None:
    _named("models")
    _named("endpoint_configs")
    _named(
        "endpoints",
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("config_name", sa.String(63), nullable=False),
        sa.Column("pending_config_name", sa.String(63), nullable=True),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column("last_modified_time", sa.Float(), nullable=False),
        sa.Column("deployment", sa.JSON(), nullable=False),
    )
    op.create_index("ix_endpoints_status", "endpoints", ["status", "id"])
    _named(
        "optimization_jobs",
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column("last_modified_time", sa.Float(), nullable=False),
        sa.Column("start_time", sa.Float(), nullable=True),
        sa.Column("end_time", sa.Float(), nullable=True),
        sa.Column("optimization_types", sa.String(256), nullable=False),
        sa.Column("output", sa.JSON(), nullable=False),
        sa.Column("owner", sa.String(256), nullable=True),
        sa.Column("heartbeat_time", sa.Float(), nullable=True),
    )
    op.create_index("ix_optimization_jobs_status", "optimization_jobs", ["status", "id"])


def downgrade() -> None:
    for table in ("optimization_jobs", "endpoints", "endpoint_configs", "models"):
        op.drop_table(table)
