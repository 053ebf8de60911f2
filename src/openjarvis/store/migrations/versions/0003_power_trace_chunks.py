"""Power traces move from one row per sample (power_sample) to packed chunks (power_trace_chunk).

Existing samples are packed with store/trace.py, in the order they were written.
"""

import sqlalchemy as sa
from alembic import op

from openjarvis.store.records import PowerSampleRecord
from openjarvis.store.trace import pack_chunks, series_to_samples, unpack_chunk

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision = "0003_power_trace_chunks"
down_revision: str | None = "0002_assistant_sessions"
branch_labels: str | None = None
depends_on: str | None = None

SAMPLE = sa.table(
    "power_sample",
    sa.column("id", sa.Integer()),
    sa.column("run_id", sa.String(32)),
    sa.column("source", sa.String(255)),
    sa.column("time_s", sa.Float()),
    sa.column("power_w", sa.Float()),
)
CHUNK = sa.table(
    "power_trace_chunk",
    sa.column("id", sa.Integer()),
    sa.column("run_id", sa.String(32)),
    sa.column("source", sa.String(255)),
    sa.column("samples", sa.Integer()),
    sa.column("start_s", sa.Float()),
    sa.column("times_s", sa.LargeBinary()),
    sa.column("power_w", sa.LargeBinary()),
)


def upgrade() -> None:
    op.create_table(
        "power_trace_chunk",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("source", sa.String(255), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("start_s", sa.Float(), nullable=False),
        sa.Column("times_s", sa.LargeBinary(), nullable=False),
        sa.Column("power_w", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["run.id"], name="fk_power_trace_chunk_run_id_run", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_power_trace_chunk"),
    )
    op.create_index("ix_power_trace_chunk_run_id", "power_trace_chunk", ["run_id"])
    bind = op.get_bind()
    for run_id in bind.execute(sa.select(SAMPLE.c.run_id).distinct()).scalars().all():
        rows = bind.execute(
            sa.select(SAMPLE.c.source, SAMPLE.c.time_s, SAMPLE.c.power_w)
            .where(SAMPLE.c.run_id == run_id)
            .order_by(SAMPLE.c.id)
        )
        samples = [PowerSampleRecord(*row) for row in rows]
        bind.execute(sa.insert(CHUNK), list(pack_chunks(run_id, samples)))
    op.drop_index("ix_power_sample_run_id", table_name="power_sample")
    op.drop_table("power_sample")


def downgrade() -> None:
    op.create_table(
        "power_sample",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("source", sa.String(255), nullable=False),
        sa.Column("time_s", sa.Float(), nullable=False),
        sa.Column("power_w", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["run.id"], name="fk_power_sample_run_id_run", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_power_sample"),
    )
    op.create_index("ix_power_sample_run_id", "power_sample", ["run_id"])
    bind = op.get_bind()
    chunks = bind.execute(
        sa.select(CHUNK.c.run_id, CHUNK.c.source, CHUNK.c.times_s, CHUNK.c.power_w).order_by(
            CHUNK.c.id
        )
    ).all()
    for run_id, source, times_s, power_w in chunks:
        rows = [
            {"run_id": run_id, "source": s.source, "time_s": s.time_s, "power_w": s.power_w}
            for s in series_to_samples({source: unpack_chunk(source, times_s, power_w)})
        ]
        bind.execute(sa.insert(SAMPLE), rows)
    op.drop_index("ix_power_trace_chunk_run_id", table_name="power_trace_chunk")
    op.drop_table("power_trace_chunk")
