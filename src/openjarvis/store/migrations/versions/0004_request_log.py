"""The request log of `jarvis serve`: request_log.

Written by hand to match `openjarvis.store.requests`; tests/store checks that they agree.
"""

import sqlalchemy as sa
from alembic import op

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision = "0004_request_log"
down_revision: str | None = "0003_power_trace_chunks"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "request_log",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("model_name", sa.String(255), nullable=False),
        sa.Column("engine", sa.String(64), nullable=False),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("finish_reason", sa.String(32), nullable=False),
        sa.Column("wall_s", sa.Float(), nullable=False),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("decode_tokens_per_s", sa.Float(), nullable=True),
        sa.Column("energy_j", sa.Float(), nullable=True),
        sa.Column("net_energy_j", sa.Float(), nullable=True),
        sa.Column("energy_method", sa.String(32), nullable=True),
        sa.Column("energy_scope", sa.String(32), nullable=False),
        sa.Column("energy_null_reason", sa.String(64), nullable=True),
        sa.Column("energy_sources", sa.JSON(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_request_log"),
    )
    op.create_index("ix_request_log_started_at", "request_log", ["started_at"])
    op.create_index("ix_request_log_model_name", "request_log", ["model_name"])


def downgrade() -> None:
    op.drop_table("request_log")
