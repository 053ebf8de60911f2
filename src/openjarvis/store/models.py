"""The results database's tables as SQLAlchemy declarative models, and their records.

Each model converts to and from the plain dataclasses in `openjarvis.records` by field name
(store/mapping.py), so no row leaves the store and no field list is written twice.
"""

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from openjarvis.records import EnergyRecord, HostRecord, RunRecord, TaskResultRecord
from openjarvis.store.mapping import column_values, field_values, shared_names

__all__ = [
    "RUN_NAMES",
    "RUN_STATES",
    "Base",
    "EnergyReading",
    "Host",
    "Model",
    "PowerTraceChunk",
    "Run",
    "TaskResult",
    "UTCDateTime",
]

RUN_STATES = ("running", "complete", "interrupted", "failed")

# Named constraints let later migrations alter tables on SQLite (batch mode needs the names).
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out, whatever the dialect keeps.

    SQLite stores no offset, so values are normalised to UTC before they are written.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the store keeps aware UTC times only")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# none_as_null: a Python None must be SQL NULL, not the JSON literal 'null'.
NullableJSON = JSON(none_as_null=True)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Host(Base):
    __tablename__ = "host"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(128), unique=True)
    hostname: Mapped[str] = mapped_column(String(255))
    cpu_model: Mapped[str] = mapped_column(String(255))
    cpu_physical_cores: Mapped[int | None] = mapped_column(Integer)  # NULL: the OS cannot tell
    cpu_logical_cores: Mapped[int | None] = mapped_column(Integer)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    gpus: Mapped[list[str]] = mapped_column(JSON)
    gpu_driver: Mapped[str | None] = mapped_column(String(64))
    os: Mapped[str] = mapped_column(String(255))

    @classmethod
    def from_record(cls, record: HostRecord) -> "Host":
        return cls(**column_values(record, _HOST_NAMES))

    def to_record(self) -> HostRecord:
        return HostRecord(**field_values(self, HostRecord, _HOST_NAMES))


_HOST_NAMES = shared_names(Host, HostRecord)


class Model(Base):
    """A model file (or a cloud model, which has no file and so no sha256)."""

    __tablename__ = "model"
    __table_args__ = (UniqueConstraint("name", "sha256"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    sha256: Mapped[str | None] = mapped_column(String(64))
    path: Mapped[str | None] = mapped_column(Text)
    quantisation: Mapped[str | None] = mapped_column(String(64))
    parameters: Mapped[int | None] = mapped_column(BigInteger)
    kind: Mapped[str | None] = mapped_column(String(16))  # "base" | "chat"; NULL: unknown
    kind_evidence: Mapped[str | None] = mapped_column(Text)  # what in the header decided it


class Run(Base):
    __tablename__ = "run"
    __table_args__ = (CheckConstraint(f"state IN {RUN_STATES!r}", name="state"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # uuid4 hex
    host_id: Mapped[int | None] = mapped_column(ForeignKey("host.id"), index=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("model.id"), index=True)
    engine: Mapped[str] = mapped_column(String(64))
    engine_settings: Mapped[dict[str, object]] = mapped_column(JSON)
    suite: Mapped[str] = mapped_column(String(255), index=True)
    options: Mapped[dict[str, object]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    tool_version: Mapped[str] = mapped_column(String(64))
    energy_scope: Mapped[str] = mapped_column(String(32))
    energy_method: Mapped[str | None] = mapped_column(String(32))
    sandbox_isolation: Mapped[str] = mapped_column(String(32))
    idle_power_w: Mapped[dict[str, float | None]] = mapped_column(JSON)  # per source
    summary: Mapped[dict[str, object] | None] = mapped_column(NullableJSON)
    energy_coverage: Mapped[dict[str, object]] = mapped_column(JSON, server_default="{}")
    idle_after_power_w: Mapped[dict[str, float | None]] = mapped_column(JSON, server_default="{}")
    process_host: Mapped[str | None] = mapped_column(String(255))
    process_pid: Mapped[int | None] = mapped_column(Integer)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    concurrency: Mapped[int] = mapped_column(Integer, server_default="1")  # tasks in flight
    config: Mapped[dict[str, object] | None] = mapped_column(NullableJSON)  # RunConfig
    suite_sha256: Mapped[str | None] = mapped_column(String(64), index=True)

    host: Mapped[Host | None] = relationship(lazy="joined")
    model: Mapped[Model] = relationship(lazy="joined")

    def to_record(self) -> RunRecord:
        return RunRecord(
            host=self.host.to_record() if self.host is not None else None,
            **field_values(self, RunRecord, RUN_NAMES),
            **field_values(self.model, RunRecord, RUN_MODEL_NAMES, prefix="model_"),
        )


# A run record's model_* fields are the model row's columns; its host is the host row.
RUN_MODEL_NAMES = shared_names(Model, RunRecord, prefix="model_")
RUN_NAMES = shared_names(
    Run, RunRecord, elsewhere={"host", *(f"model_{name}" for name in RUN_MODEL_NAMES)}
)


class TaskResult(Base):
    __tablename__ = "task_result"
    __table_args__ = (UniqueConstraint("run_id", "task_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"))
    task_id: Mapped[str] = mapped_column(String(255))
    samples: Mapped[int] = mapped_column(Integer)
    passed: Mapped[int] = mapped_column(Integer)
    latency_s: Mapped[float] = mapped_column(Float)
    ttft_s: Mapped[float | None] = mapped_column(Float)
    decode_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    energy_j: Mapped[float | None] = mapped_column(Float)
    net_energy_j: Mapped[float | None] = mapped_column(Float)
    energy_null_reason: Mapped[str | None] = mapped_column(String(64))
    completions: Mapped[list[str]] = mapped_column(JSON)
    statuses: Mapped[list[str]] = mapped_column(JSON)
    tail_energy_j: Mapped[float | None] = mapped_column(Float)
    prefill_energy_j: Mapped[float | None] = mapped_column(Float)
    decode_energy_j: Mapped[float | None] = mapped_column(Float)
    overlapped: Mapped[bool] = mapped_column(Boolean, server_default=false())
    shared: Mapped[bool] = mapped_column(Boolean, server_default=false())
    mean_batch: Mapped[float | None] = mapped_column(Float)

    energy_readings: Mapped[list["EnergyReading"]] = relationship(
        lazy="selectin", cascade="all, delete-orphan", order_by="EnergyReading.id"
    )

    @classmethod
    def from_record(cls, run_id: str, record: TaskResultRecord) -> "TaskResult":
        return cls(
            run_id=run_id,
            energy_readings=[EnergyReading.from_record(energy) for energy in record.energy],
            **column_values(record, _TASK_NAMES),
        )

    def to_record(self) -> TaskResultRecord:
        return TaskResultRecord(
            energy=tuple(reading.to_record() for reading in self.energy_readings),
            **field_values(self, TaskResultRecord, _TASK_NAMES),
        )


class EnergyReading(Base):
    """One source's energy over one task's windows; NULL energy comes with a null_reason."""

    __tablename__ = "energy_reading"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_result_id: Mapped[int] = mapped_column(
        ForeignKey("task_result.id", ondelete="CASCADE"), index=True
    )
    source: Mapped[str] = mapped_column(String(255))
    domain: Mapped[str] = mapped_column(String(32))
    method: Mapped[str] = mapped_column(String(32))
    energy_j: Mapped[float | None] = mapped_column(Float)
    net_energy_j: Mapped[float | None] = mapped_column(Float)
    idle_power_w: Mapped[float | None] = mapped_column(Float)
    null_reason: Mapped[str | None] = mapped_column(String(64))
    low_resolution: Mapped[bool] = mapped_column(Boolean)

    @classmethod
    def from_record(cls, record: EnergyRecord) -> "EnergyReading":
        return cls(**column_values(record, _ENERGY_NAMES))

    def to_record(self) -> EnergyRecord:
        return EnergyRecord(**field_values(self, EnergyRecord, _ENERGY_NAMES))


_ENERGY_NAMES = shared_names(EnergyReading, EnergyRecord)
_TASK_NAMES = shared_names(TaskResult, TaskResultRecord, elsewhere={"energy"})


class PowerTraceChunk(Base):
    """Part of a run's power trace: up to TRACE_CHUNK_SAMPLES samples of one source, packed.

    One row per sample made a million-sample trace take many seconds to write (a foreign key
    check and an index entry per row); packed arrays take milliseconds. See store/trace.py.
    """

    __tablename__ = "power_trace_chunk"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), index=True)
    source: Mapped[str] = mapped_column(String(255))
    samples: Mapped[int] = mapped_column(Integer)
    start_s: Mapped[float] = mapped_column(Float)  # earliest time in the chunk, for ordering
    times_s: Mapped[bytes] = mapped_column(LargeBinary)  # float64 little-endian, since run start
    power_w: Mapped[bytes] = mapped_column(LargeBinary)  # float64 little-endian, one per time
