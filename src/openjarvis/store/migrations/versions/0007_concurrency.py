"""Concurrency: tasks and requests that shared the engine with others.

task_result and request_log: whether the energy was split with windows that ran at once, by
the work each did (`shared`), and the time-weighted batch size of the steps (`mean_batch`,
NULL where the engine reported no steps). run: how many tasks were in flight at once (1 for
runs measured before it was stored, which ran one task at a time).
"""

import sqlalchemy as sa
from alembic import op

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision = "0007_concurrency"
down_revision: str | None = "0006_model_kind"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    for table in ("task_result", "request_log"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(
                sa.Column("shared", sa.Boolean(), nullable=False, server_default=sa.false())
            )
            batch.add_column(sa.Column("mean_batch", sa.Float(), nullable=True))
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("concurrency", sa.Integer(), nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.drop_column("concurrency")
    for table in ("request_log", "task_result"):
        with op.batch_alter_table(table) as batch:
            for column in ("mean_batch", "shared"):
                batch.drop_column(column)
