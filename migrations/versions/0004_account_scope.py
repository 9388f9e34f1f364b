"""account_id on every resource: the account of the key that created it

Each access key acts for an account (`eaglenest keys`); a resource belongs to the account
of its creator and only that account's requests find it. Existing rows belong to the
account in their ARN (arn:aws:sagemaker:<region>:<account>:<kind>/<name>).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TABLES = ("models", "endpoint_configs", "endpoints", "optimization_jobs")


def upgrade() -> None:
    bind = op.get_bind()
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("account_id", sa.String(12), nullable=False,
                                       server_default="000000000000"))
        t = sa.table(table, sa.column("id", sa.Integer), sa.column("arn", sa.String),
                     sa.column("account_id", sa.String))
        for row_id, arn in bind.execute(sa.select(t.c.id, t.c.arn)).all():
            parts = arn.split(":")
            if len(parts) > 4 and parts[4]:
                bind.execute(t.update().where(t.c.id == row_id).values(account_id=parts[4]))
        op.create_index(f"ix_{table}_account", table, ["account_id", "creation_time", "id"])


def downgrade() -> None:
    for table in TABLES:
        op.drop_index(f"ix_{table}_account", table_name=table)
        with op.batch_alter_table(table) as batch:
            batch.drop_column("account_id")
