"""names unique per account: UNIQUE(account_id, name_key) instead of UNIQUE(name_key)

Two accounts may each have a model (endpoint config, endpoint, optimization job) of the
same name, as in AWS; one account still cannot have two. Workers find a row by its ARN
(it names the account), hence a unique index on `arn`.

0001 created the name_key constraint without a name: PostgreSQL called it
`<table>_name_key_key`, SQLite reflects it nameless. It is found by its column on either.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TABLES = ("models", "endpoint_configs", "endpoints", "optimization_jobs")
#: what a nameless unique constraint is called inside batch_alter_table (SQLite reflects
#: 0001's without a name; batch mode needs one to drop it)
CONVENTION = {"uq": "uq_%(table_name)s_%(column_0_name)s"}


def _name_key_unique(table: str) -> str:
    """The name of the unique constraint over name_key alone (CONVENTION's when nameless)."""
    for uc in sa.inspect(op.get_bind()).get_unique_constraints(table):
        if uc["column_names"] == ["name_key"]:
            return uc["name"] or f"uq_{table}_name_key"
    raise RuntimeError(f"{table}: no unique constraint on name_key to replace")


def upgrade() -> None:
    for table in TABLES:
        old = _name_key_unique(table)
        with op.batch_alter_table(table, naming_convention=CONVENTION) as batch:
            batch.drop_constraint(old, type_="unique")
            batch.create_unique_constraint(f"uq_{table}_account_name",
                                           ["account_id", "name_key"])
        op.create_index(f"ux_{table}_arn", table, ["arn"], unique=True)


def downgrade() -> None:
    """Fails while two accounts have a resource of the same name (UNIQUE(name_key) again)."""
    for table in TABLES:
        op.drop_index(f"ux_{table}_arn", table_name=table)
        with op.batch_alter_table(table, naming_convention=CONVENTION) as batch:
            batch.drop_constraint(f"uq_{table}_account_name", type_="unique")
            batch.create_unique_constraint(f"uq_{table}_name_key", ["name_key"])
