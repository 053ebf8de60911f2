"""Window edges, energy coverage and live runs.

task_result: the tail share (energy above idle after the task, before the next window),
prefill and decode energy, and whether the task's windows overlapped others. run: which energy
sources were in scope, out of it or missing; idle power measured after the run; the process
that measures the run and its latest heartbeat.
"""

import sqlalchemy as sa
from alembic import op

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision = "0005_edges_scope_liveness"
down_revision: str | None = "0004_request_log"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("task_result") as batch:
        batch.add_column(sa.Column("tail_energy_j", sa.Float(), nullable=True))
        batch.add_column(sa.Column("prefill_energy_j", sa.Float(), nullable=True))
        batch.add_column(sa.Column("decode_energy_j", sa.Float(), nullable=True))
        batch.add_column(
            sa.Column("overlapped", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    with op.batch_alter_table("run") as batch:
        batch.add_column(
            sa.Column("energy_coverage", sa.JSON(), nullable=False, server_default="{}")
        )
        batch.add_column(
            sa.Column("idle_after_power_w", sa.JSON(), nullable=False, server_default="{}")
        )
        batch.add_column(sa.Column("process_host", sa.String(255), nullable=True))
        batch.add_column(sa.Column("process_pid", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run") as batch:
        for column in (
            "heartbeat_at",
            "process_pid",
            "process_host",
            "idle_after_power_w",
            "energy_coverage",
        ):
            batch.drop_column(column)
    with op.batch_alter_table("task_result") as batch:
        for column in ("overlapped", "decode_energy_j", "prefill_energy_j", "tail_energy_j"):
            batch.drop_column(column)
