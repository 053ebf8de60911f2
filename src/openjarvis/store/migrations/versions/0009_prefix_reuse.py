"""Prompt reuse: how many prompt tokens an engine took from its cache, and the joules that saved.

request_log and assistant_message: `cached_tokens` (NULL where the engine did not say),
`prefill_energy_j` (the request's energy up to its first token, NULL where not split) and
`prefill_saved_j` (the prefill joules the cached tokens would have cost, an estimate; NULL where
no cold prefill had been measured to price them).
"""

import sqlalchemy as sa
from alembic import op

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision = "0009_prefix_reuse"
down_revision: str | None = "0008_host_cores_unknown"
branch_labels: str | None = None
depends_on: str | None = None

TABLES = ("request_log", "assistant_message")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("cached_tokens", sa.Integer(), nullable=True))
            batch.add_column(sa.Column("prefill_energy_j", sa.Float(), nullable=True))
            batch.add_column(sa.Column("prefill_saved_j", sa.Float(), nullable=True))


def downgrade() -> None:
    for table in reversed(TABLES):
        with op.batch_alter_table(table) as batch:
            for column in ("prefill_saved_j", "prefill_energy_j", "cached_tokens"):
                batch.drop_column(column)
