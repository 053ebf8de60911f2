"""The request log of `jarvis serve`: one row per answered request with its tokens, timings and
energy (per source, with method), so `ipw` can show the joules of a coding session afterwards.
"""

from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import JSON, Boolean, Float, Integer, String, false, select
from sqlalchemy.orm import Mapped, mapped_column

from openjarvis.store.mapping import column_values, field_values, shared_names
from openjarvis.store.models import Base, UTCDateTime
from openjarvis.store.store import Store

__all__ = ["RequestLogRecord", "log_request", "request_logs"]


@dataclass(frozen=True, slots=True)
class RequestLogRecord:
    """One request; energy is None with `energy_null_reason` when it could not be obtained."""

    endpoint: str  # "/v1/chat/completions" | "/v1/completions"
    model_name: str
    engine: str  # "llamacpp" | "openai" | "anthropic"
    stream: bool
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    wall_s: float
    ttft_s: float | None
    decode_tokens_per_s: float | None
    energy_j: float | None
    net_energy_j: float | None
    energy_method: str | None  # "counter" | "integrated" | "estimate"
    energy_scope: str  # "accelerator" | "system"
    energy_null_reason: str | None
    # Per source: {"source", "domain", "method", "energy_j", "net_energy_j", "null_reason"}.
    energy_sources: list[dict[str, object]] = field(default_factory=list)
    cost_usd: float | None = None
    # The energy was split with requests served at once, by the work each did (docs/energy.md),
    # and the time-weighted batch size of its engine steps (None: the engine reported none).
    shared: bool = False
    mean_batch: float | None = None
    # Prompt tokens the engine took from its cache (None: it did not say), the energy up to
    # the first token, and the prefill joules the cached tokens saved (an estimate, None
    # until a cold prefill has priced a prompt token; docs/assistant.md).
    cached_tokens: int | None = None
    prefill_energy_j: float | None = None
    prefill_saved_j: float | None = None
    started_at: datetime | None = None  # set by log_request when None
    id: int | None = None


class RequestLog(Base):
    __tablename__ = "request_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    endpoint: Mapped[str] = mapped_column(String(64))
    model_name: Mapped[str] = mapped_column(String(255), index=True)
    engine: Mapped[str] = mapped_column(String(64))
    stream: Mapped[bool] = mapped_column(Boolean)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    finish_reason: Mapped[str] = mapped_column(String(32))
    wall_s: Mapped[float] = mapped_column(Float)
    ttft_s: Mapped[float | None] = mapped_column(Float)
    decode_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    energy_j: Mapped[float | None] = mapped_column(Float)
    net_energy_j: Mapped[float | None] = mapped_column(Float)
    energy_method: Mapped[str | None] = mapped_column(String(32))
    energy_scope: Mapped[str] = mapped_column(String(32))
    energy_null_reason: Mapped[str | None] = mapped_column(String(64))
    energy_sources: Mapped[list[dict[str, object]]] = mapped_column(JSON)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    shared: Mapped[bool] = mapped_column(Boolean, server_default=false())
    mean_batch: Mapped[float | None] = mapped_column(Float)
    cached_tokens: Mapped[int | None] = mapped_column(Integer)
    prefill_energy_j: Mapped[float | None] = mapped_column(Float)
    prefill_saved_j: Mapped[float | None] = mapped_column(Float)

    def to_record(self) -> RequestLogRecord:
        return RequestLogRecord(**field_values(self, RequestLogRecord, _FIELDS))


_FIELDS = shared_names(RequestLog, RequestLogRecord)


# These functions write and read their own tables through Store.session(), one transaction each.


def log_request(store: Store, record: RequestLogRecord) -> int:
    """Save one request and commit at once; returns its id."""
    with store.session() as session:
        values = column_values(record, (name for name in _FIELDS if name != "id"))
        values["started_at"] = record.started_at or datetime.now(UTC)
        row = RequestLog(**values)
        session.add(row)
        session.flush()
        return row.id


def request_logs(
    store: Store, since: datetime | None = None, model: str | None = None, limit: int | None = None
) -> list[RequestLogRecord]:
    """Logged requests, oldest first, filtered by start time and model name."""
    query = select(RequestLog).order_by(RequestLog.started_at, RequestLog.id)
    if since is not None:
        query = query.where(RequestLog.started_at >= since)
    if model is not None:
        query = query.where(RequestLog.model_name == model)
    if limit is not None:
        query = query.limit(limit)
    with store.session() as session:
        return [row.to_record() for row in session.scalars(query)]
