"""The coding assistant's tables: assistant_session and assistant_message.

Written by hand to match `openjarvis.store.assistant`; tests/store checks that they agree.
"""

import sqlalchemy as sa
from alembic import op

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision = "0002_assistant_sessions"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None

UTC_DATETIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "assistant_session",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("working_dir", sa.Text(), nullable=False),
        sa.Column("model_name", sa.String(255), nullable=False),
        sa.Column("started_at", UTC_DATETIME, nullable=False),
        sa.Column("updated_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_assistant_session"),
    )
    op.create_index("ix_assistant_session_working_dir", "assistant_session", ["working_dir"])
    op.create_index("ix_assistant_session_updated_at", "assistant_session", ["updated_at"])
    op.create_table(
        "assistant_message",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.String(32), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("context_tokens", sa.Integer(), nullable=False),
        sa.Column("context_tokens_exact", sa.Boolean(), nullable=False),
        sa.Column("model_name", sa.String(255), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("energy_j", sa.Float(), nullable=True),
        sa.Column("energy_method", sa.String(32), nullable=True),
        sa.Column("energy_null_reason", sa.String(64), nullable=True),
        sa.Column("cost_usd", sa.Float(), nullable=True),
        sa.Column("in_context", sa.Boolean(), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.CheckConstraint(
            "role IN ('user', 'assistant', 'tool')", name="ck_assistant_message_role"
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["assistant_session.id"],
            name="fk_assistant_message_session_id_assistant_session",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_assistant_message"),
        sa.UniqueConstraint(
            "session_id", "position", name="uq_assistant_message_session_id_position"
        ),
    )


def downgrade() -> None:
    op.drop_table("assistant_message")
    op.drop_table("assistant_session")
