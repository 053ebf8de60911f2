"""The run's configuration and its suite's identity.

run: `config`, the typed configuration of `ipw measure` as JSON (engine, model, suite with its
options, judge, meter, concurrency), which --resume reads back; `suite_sha256`, the hash of the
suite's tasks (and judge), so that one suite reached by two paths is one suite. Both NULL for
runs stored before them.
"""

import sqlalchemy as sa
from alembic import op

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision = "0010_run_config"
down_revision: str | None = "0009_prefix_reuse"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("config", sa.JSON(none_as_null=True), nullable=True))
        batch.add_column(sa.Column("suite_sha256", sa.String(64), nullable=True))
        batch.create_index("ix_run_suite_sha256", ["suite_sha256"])


def downgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.drop_index("ix_run_suite_sha256")
        batch.drop_column("suite_sha256")
        batch.drop_column("config")
