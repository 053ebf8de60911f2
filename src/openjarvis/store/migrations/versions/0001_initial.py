"""The first schema: host, model, run, task_result, energy_reading and power_sample.

Written by hand to match `openjarvis.store.models`; tests/store checks that they agree.
"""

import sqlalchemy as sa
from alembic import op

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

UTC_DATETIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "host",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(128), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("cpu_model", sa.String(255), nullable=False),
        sa.Column("cpu_physical_cores", sa.Integer(), nullable=False),
        sa.Column("cpu_logical_cores", sa.Integer(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("gpu_driver", sa.String(64), nullable=True),
        sa.Column("os", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_host"),
        sa.UniqueConstraint("fingerprint", name="uq_host_fingerprint"),
    )
    op.create_table(
        "model",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=True),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("quantisation", sa.String(64), nullable=True),
        sa.Column("parameters", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_model"),
        sa.UniqueConstraint("name", "sha256", name="uq_model_name_sha256"),
    )
    op.create_table(
        "run",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=True),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("engine", sa.String(64), nullable=False),
        sa.Column("engine_settings", sa.JSON(), nullable=False),
        sa.Column("suite", sa.String(255), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("started_at", UTC_DATETIME, nullable=False),
        sa.Column("finished_at", UTC_DATETIME, nullable=True),
        sa.Column("tool_version", sa.String(64), nullable=False),
        sa.Column("energy_scope", sa.String(32), nullable=False),
        sa.Column("energy_method", sa.String(32), nullable=True),
        sa.Column("sandbox_isolation", sa.String(32), nullable=False),
        sa.Column("idle_power_w", sa.JSON(), nullable=False),
        sa.Column("summary", sa.JSON(none_as_null=True), nullable=True),
        sa.CheckConstraint(
            "state IN ('running', 'complete', 'interrupted', 'failed')", name="ck_run_state"
        ),
        sa.ForeignKeyConstraint(["host_id"], ["host.id"], name="fk_run_host_id_host"),
        sa.ForeignKeyConstraint(["model_id"], ["model.id"], name="fk_run_model_id_model"),
        sa.PrimaryKeyConstraint("id", name="pk_run"),
    )
    op.create_index("ix_run_host_id", "run", ["host_id"])
    op.create_index("ix_run_model_id", "run", ["model_id"])
    op.create_index("ix_run_suite", "run", ["suite"])
    op.create_index("ix_run_started_at", "run", ["started_at"])
    op.create_table(
        "task_result",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("task_id", sa.String(255), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("passed", sa.Integer(), nullable=False),
        sa.Column("latency_s", sa.Float(), nullable=False),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("decode_tokens_per_s", sa.Float(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("energy_j", sa.Float(), nullable=True),
        sa.Column("net_energy_j", sa.Float(), nullable=True),
        sa.Column("energy_null_reason", sa.String(64), nullable=True),
        sa.Column("completions", sa.JSON(), nullable=False),
        sa.Column("statuses", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["run.id"], name="fk_task_result_run_id_run", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_task_result"),
        sa.UniqueConstraint("run_id", "task_id", name="uq_task_result_run_id_task_id"),
    )
    op.create_table(
        "energy_reading",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_result_id", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(255), nullable=False),
        sa.Column("domain", sa.String(32), nullable=False),
        sa.Column("method", sa.String(32), nullable=False),
        sa.Column("energy_j", sa.Float(), nullable=True),
        sa.Column("net_energy_j", sa.Float(), nullable=True),
        sa.Column("idle_power_w", sa.Float(), nullable=True),
        sa.Column("null_reason", sa.String(64), nullable=True),
        sa.Column("low_resolution", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["task_result_id"],
            ["task_result.id"],
            name="fk_energy_reading_task_result_id_task_result",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_energy_reading"),
    )
    op.create_index("ix_energy_reading_task_result_id", "energy_reading", ["task_result_id"])
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


def downgrade() -> None:
    for table in ("power_sample", "energy_reading", "task_result", "run", "model", "host"):
        op.drop_table(table)
