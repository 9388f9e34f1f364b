"""optimization_jobs.progress: a running job's stage and training progress

Read by `eaglenest status`; no API shape returns it (DescribeOptimizationJob has no
progress member).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("optimization_jobs") as batch:
        batch.add_column(sa.Column("progress", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("optimization_jobs") as batch:
        batch.drop_column("progress")
