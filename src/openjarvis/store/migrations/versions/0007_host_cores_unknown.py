"""Host core counts may be unknown: NULL instead of the 0 stored when psutil could not count.

No machine has 0 cores, so an existing 0 was always an unknown and becomes NULL.
"""

import sqlalchemy as sa
from alembic import op

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision = "0007_host_cores_unknown"
down_revision: str | None = "0006_model_kind"
branch_labels: str | None = None
depends_on: str | None = None

_COLUMNS = ("cpu_physical_cores", "cpu_logical_cores")


def upgrade() -> None:
    with op.batch_alter_table("host") as batch:
        for column in _COLUMNS:
            batch.alter_column(column, existing_type=sa.Integer(), nullable=True)
    for column in _COLUMNS:
        op.execute(sa.text(f"UPDATE host SET {column} = NULL WHERE {column} = 0"))


def downgrade() -> None:
    for column in _COLUMNS:
        op.execute(sa.text(f"UPDATE host SET {column} = 0 WHERE {column} IS NULL"))
    with op.batch_alter_table("host") as batch:
        for column in _COLUMNS:
            batch.alter_column(column, existing_type=sa.Integer(), nullable=False)
