"""workers and gpu_holdings: each host's GPUs and which endpoint instance or job holds each

A worker records its GPUs (EAGLENEST_GPUS, or those it detects) and heartbeats; placing an
endpoint instance or a job inserts one gpu_holdings row per GPU, unique per (host, GPU), so
two placements can never take the same GPU.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("owner", sa.String(256), primary_key=True),
        sa.Column("host", sa.String(128), nullable=False),
        sa.Column("machine", sa.String(256), nullable=False),
        sa.Column("boot", sa.String(64), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("pid_start", sa.BigInteger(), nullable=False),
        sa.Column("queues", sa.String(256), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("started_time", sa.Float(), nullable=False),
        sa.Column("heartbeat_time", sa.Float(), nullable=False),
    )
    op.create_index("ix_workers_host", "workers", ["host"])
    op.create_table(
        "gpu_holdings",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("host", sa.String(128), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(256), nullable=False),
        sa.Column("unit", sa.String(128), nullable=False),
        sa.Column("owner", sa.String(256), nullable=False),
        sa.Column("since", sa.Float(), nullable=False),
        sa.UniqueConstraint("host", "gpu_index", name="uq_gpu_holdings_gpu"),
    )
    op.create_index("ix_gpu_holdings_holder", "gpu_holdings", ["holder"])


def downgrade() -> None:
    op.drop_index("ix_gpu_holdings_holder", table_name="gpu_holdings")
    op.drop_table("gpu_holdings")
    op.drop_index("ix_workers_host", table_name="workers")
    op.drop_table("workers")
