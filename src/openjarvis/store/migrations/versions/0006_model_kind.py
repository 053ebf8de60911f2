"""Model kind: whether a model file is a base (pretrained) model or an instruction-tuned one.

model: the kind ("base" or "chat"; NULL when unknown, and for models stored before it was
read) and the header evidence that decided it (runtime/model_kind.py).
"""

import sqlalchemy as sa
from alembic import op

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision = "0006_model_kind"
down_revision: str | None = "0005_edges_scope_liveness"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("model") as batch:
        batch.add_column(sa.Column("kind", sa.String(16), nullable=True))
        batch.add_column(sa.Column("kind_evidence", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model") as batch:
        for column in ("kind_evidence", "kind"):
            batch.drop_column(column)
