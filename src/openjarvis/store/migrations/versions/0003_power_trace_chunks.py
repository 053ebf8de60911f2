"""Power traces move from one row per sample (power_sample) to packed chunks (power_trace_chunk).

Existing samples are packed in the order they were written, with this file's frozen copy of
the packing of store/trace.py: a migration must do the same thing whatever trace.py becomes.
"""

import sys
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

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

# Frozen copies of store/trace.py's packing as of revision 0003_power_trace_chunks (on plain
# tuples, not PowerSampleRecord): do not import live code here, and do not update these.
TRACE_CHUNK_SAMPLES = 8192


def _to_bytes(values: array) -> bytes:
    if sys.byteorder == "big":
        values.byteswap()
    return values.tobytes()


def _from_bytes(data: bytes) -> array:
    values = array("d")
    values.frombytes(data)
    if sys.byteorder == "big":
        values.byteswap()
    return values


def _pack_chunks(
    run_id: str, samples: Sequence[tuple[str, float, float]]
) -> Iterator[dict[str, Any]]:
    """Rows of power_trace_chunk for (source, time_s, power_w) samples, per source in order."""
    by_source: dict[str, list[tuple[str, float, float]]] = {}
    for sample in samples:
        by_source.setdefault(sample[0], []).append(sample)
    for source, group in by_source.items():
        times = array("d", [time_s for _, time_s, _ in group])
        watts = array("d", [power_w for _, _, power_w in group])
        for start in range(0, len(times), TRACE_CHUNK_SAMPLES):
            chunk_times = times[start : start + TRACE_CHUNK_SAMPLES]
            yield {
                "run_id": run_id,
                "source": source,
                "samples": len(chunk_times),
                "start_s": min(chunk_times),
                "times_s": _to_bytes(chunk_times),
                "power_w": _to_bytes(watts[start : start + TRACE_CHUNK_SAMPLES]),
            }


def _unpack_chunk(source: str, times_s: bytes, power_w: bytes) -> tuple[array, array]:
    times, watts = _from_bytes(times_s), _from_bytes(power_w)
    if len(times) != len(watts):
        raise ValueError(
            f"corrupt power trace chunk of {source}: {len(times)} times, {len(watts)} W"
        )
    return times, watts


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
        samples = [(source, time_s, power_w) for source, time_s, power_w in rows]
        bind.execute(sa.insert(CHUNK), list(_pack_chunks(run_id, samples)))
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
        times, watts = _unpack_chunk(source, times_s, power_w)
        rows = [
            {"run_id": run_id, "source": source, "time_s": time_s, "power_w": watts_now}
            for time_s, watts_now in zip(times, watts, strict=True)
        ]
        bind.execute(sa.insert(SAMPLE), rows)
    op.drop_index("ix_power_trace_chunk_run_id", table_name="power_trace_chunk")
    op.drop_table("power_trace_chunk")
