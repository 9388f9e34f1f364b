"""endpoints: the worker that runs an endpoint's transition and its last heartbeat

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("endpoints") as batch:
        batch.add_column(sa.Column("owner", sa.String(256), nullable=True))
        batch.add_column(sa.Column("heartbeat_time", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("endpoints") as batch:
        batch.drop_column("heartbeat_time")
        batch.drop_column("owner")
