"""The coding assistant's sessions and messages: their tables, records and the functions over them.

A message keeps its energy (with method) and token counts, so `/cost` and `ipw` can read them back.
"""

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
    select,
    update,
)
from sqlalchemy.orm import Mapped, mapped_column

from openjarvis.store.mapping import column_values, field_values, shared_names
from openjarvis.store.models import Base, UTCDateTime
from openjarvis.store.store import Store

__all__ = [
    "MESSAGE_ROLES",
    "AssistantMessageRecord",
    "AssistantSessionRecord",
    "add_assistant_message",
    "assistant_messages",
    "create_assistant_session",
    "latest_assistant_session",
    "set_out_of_context",
]

# "tool" is a tool's result; the assistant hands it to the model as a user turn.
MESSAGE_ROLES = ("user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class AssistantSessionRecord:
    id: str
    working_dir: str
    model_name: str
    started_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class AssistantMessageRecord:
    """One message; energy and tokens are set on assistant replies only (None elsewhere)."""

    role: str  # one of MESSAGE_ROLES
    content: str
    context_tokens: int  # what the message takes in the model's context
    context_tokens_exact: bool  # counted by the engine, not estimated from characters
    model_name: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    energy_j: float | None = None
    energy_method: str | None = None  # "counter" | "integrated" | "estimate"
    energy_null_reason: str | None = None
    cost_usd: float | None = None
    # Replies: prompt tokens the engine took from its cache, the energy up to the first token,
    # and the prefill joules the cached tokens saved (an estimate); None when not known.
    cached_tokens: int | None = None
    prefill_energy_j: float | None = None
    prefill_saved_j: float | None = None
    in_context: bool = True  # False once the user dropped it to fit the context
    id: int | None = None
    created_at: datetime | None = None


class AssistantSession(Base):
    __tablename__ = "assistant_session"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # uuid4 hex
    working_dir: Mapped[str] = mapped_column(Text, index=True)
    model_name: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)

    def to_record(self) -> AssistantSessionRecord:
        return AssistantSessionRecord(**field_values(self, AssistantSessionRecord, _SESSION_NAMES))


_SESSION_NAMES = shared_names(AssistantSession, AssistantSessionRecord)


class AssistantMessage(Base):
    __tablename__ = "assistant_message"
    __table_args__ = (
        UniqueConstraint("session_id", "position"),
        CheckConstraint(f"role IN {MESSAGE_ROLES!r}", name="role"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("assistant_session.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    context_tokens: Mapped[int] = mapped_column(Integer)
    context_tokens_exact: Mapped[bool] = mapped_column(Boolean)
    model_name: Mapped[str | None] = mapped_column(String(255))
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    energy_j: Mapped[float | None] = mapped_column(Float)
    energy_method: Mapped[str | None] = mapped_column(String(32))
    energy_null_reason: Mapped[str | None] = mapped_column(String(64))
    cost_usd: Mapped[float | None] = mapped_column(Float)
    cached_tokens: Mapped[int | None] = mapped_column(Integer)
    prefill_energy_j: Mapped[float | None] = mapped_column(Float)
    prefill_saved_j: Mapped[float | None] = mapped_column(Float)
    in_context: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    def to_record(self) -> AssistantMessageRecord:
        return AssistantMessageRecord(**field_values(self, AssistantMessageRecord, _MESSAGE_NAMES))


_MESSAGE_NAMES = shared_names(AssistantMessage, AssistantMessageRecord)


# These functions write and read their own tables through Store.session(), one transaction each.


def create_assistant_session(store: Store, working_dir: str, model_name: str) -> str:
    """A new, empty session; returns its id (uuid4 hex)."""
    session_id = uuid.uuid4().hex
    now = datetime.now(UTC)
    with store.session() as session:
        session.add(
            AssistantSession(
                id=session_id,
                working_dir=working_dir,
                model_name=model_name,
                started_at=now,
                updated_at=now,
            )
        )
    return session_id


def add_assistant_message(store: Store, session_id: str, message: AssistantMessageRecord) -> int:
    """Append a message at the session's end; returns the message's id."""
    if message.role not in MESSAGE_ROLES:
        raise ValueError(f"role must be one of {MESSAGE_ROLES}, not {message.role!r}")
    now = datetime.now(UTC)
    with store.session() as session:
        owner = session.get(AssistantSession, session_id)
        if owner is None:
            raise ValueError(f"no assistant session {session_id} in the store")
        last = session.scalar(
            select(func.max(AssistantMessage.position)).where(
                AssistantMessage.session_id == session_id
            )
        )
        row = AssistantMessage(
            session_id=session_id,
            position=0 if last is None else last + 1,
            created_at=now,
            **column_values(message, (n for n in _MESSAGE_NAMES if n not in {"id", "created_at"})),
        )
        session.add(row)
        owner.updated_at = now
        if message.model_name is not None:
            owner.model_name = message.model_name
        session.flush()
        return row.id


def set_out_of_context(store: Store, session_id: str, message_ids: list[int]) -> None:
    """Mark messages the user dropped to fit the context; they stay stored and shown."""
    if not message_ids:
        return
    with store.session() as session:
        session.execute(
            update(AssistantMessage)
            .where(
                AssistantMessage.session_id == session_id,
                AssistantMessage.id.in_(message_ids),
            )
            .values(in_context=False)
        )


def latest_assistant_session(store: Store, working_dir: str) -> AssistantSessionRecord | None:
    """The session in `working_dir` that was written to last, or None."""
    query = (
        select(AssistantSession)
        .where(AssistantSession.working_dir == working_dir)
        .order_by(AssistantSession.updated_at.desc(), AssistantSession.id)
        .limit(1)
    )
    with store.session() as session:
        found = session.scalar(query)
        return None if found is None else found.to_record()


def assistant_messages(store: Store, session_id: str) -> list[AssistantMessageRecord]:
    """The session's messages in the order they were written."""
    query = (
        select(AssistantMessage)
        .where(AssistantMessage.session_id == session_id)
        .order_by(AssistantMessage.position)
    )
    with store.session() as session:
        return [row.to_record() for row in session.scalars(query)]
