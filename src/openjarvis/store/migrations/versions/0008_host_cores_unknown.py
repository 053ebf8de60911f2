"""Host core counts may be unknown.

host: cpu_physical_cores and cpu_logical_cores accept NULL (the OS could not tell). Hosts
stored before keep their 0 for an unknown count until the readers of host rows show NULL (the
report's hardware label prints the count as it is). SQLite rebuilds the table for this, so the
caller turns foreign keys off around the migration (store/database.py, _migrate).
"""

import sqlalchemy as sa
from alembic import op

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision = "0008_host_cores_unknown"
down_revision: str | None = "0007_concurrency"
branch_labels: str | None = None
depends_on: str | None = None

COLUMNS = ("cpu_physical_cores", "cpu_logical_cores")


def upgrade() -> None:
    with op.batch_alter_table("host") as batch:
        for column in COLUMNS:
            batch.alter_column(column, existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    for column in COLUMNS:
        op.execute(f"UPDATE host SET {column} = 0 WHERE {column} IS NULL")
    with op.batch_alter_table("host") as batch:
        for column in COLUMNS:
            batch.alter_column(column, existing_type=sa.Integer(), nullable=False)
