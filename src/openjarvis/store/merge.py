"""Copying runs, and `jarvis serve`'s request log, from one results database into another, for
`ipw db merge` and `ipw db export`.

Idempotent: hosts match by fingerprint, models by (name, sha256), runs by id, logged requests by
when they started and what they were, so merging the same database twice leaves one copy of
each. All or nothing: one transaction for everything.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from openjarvis.store.models import PowerTraceChunk, Run, TaskResult
from openjarvis.store.requests import RequestLog
from openjarvis.store.store import Store, run_row

__all__ = ["MergeCounts", "merge_all", "merge_into"]

TRACE_CHUNKS_PER_BATCH = 64  # chunks per read and insert: about 16 MiB at a time
REQUESTS_PER_BATCH = 1000


@dataclass(frozen=True, slots=True)
class MergeCounts:
    added: int  # runs the target did not have
    replaced: int  # runs the target had in an earlier state (fewer tasks, or not complete)
    unchanged: int  # runs the target already had as far along
    requests_added: int = 0  # `jarvis serve` request log rows the target did not have


def merge_into(target: Store, source: Store) -> MergeCounts:
    """Copy every run of `source` (tasks, energy, power trace) into `target`; see merge_all."""
    return merge_all(target, [source])[0]


def merge_all(target: Store, sources: Sequence[Store]) -> list[MergeCounts]:
    """Copy every run of each source into `target` in one transaction: all of it, or nothing.

    A run already in the target is replaced only when the source's copy got further (complete
    where the target's was not, or more saved tasks), so a merge never loses work. Sources are
    only read.
    """
    for source in sources:
        if target.url == source.url:
            raise ValueError(f"cannot merge {source.url} into itself")
    # One transaction on the target for every source: all of it, or nothing.
    with target.session() as writing:
        return [_merge_source(writing, source) for source in sources]


def _merge_source(writing: Session, source: Store) -> MergeCounts:
    added = replaced = unchanged = 0
    with source.session() as reading:
        run_ids = list(reading.scalars(select(Run.id).order_by(Run.started_at, Run.id)))
    for run_id in run_ids:
        with source.session() as reading:
            incoming = _progress(reading, run_id)
            present = _progress(writing, run_id)
            if incoming is None:  # deleted from the source since it was listed: nothing to copy
                continue
            if present is not None and present >= incoming:
                unchanged += 1
                continue
            if present is not None:
                # Tasks, energy readings and samples go with the run (ON DELETE CASCADE).
                writing.execute(delete(Run).where(Run.id == run_id))
                replaced += 1
            else:
                added += 1
            _copy_run(reading, writing, run_id)
        # The run is written; forgetting its objects keeps memory to one run at a time and lets
        # a later source replace it within this transaction.
        writing.flush()
        writing.expunge_all()
    return MergeCounts(added, replaced, unchanged, _merge_requests(writing, source))


# What identifies a logged request across databases (its row id is local to each): when it
# started, where, on which model, and its tokens and time.
_REQUEST_KEY = (
    "started_at",
    "endpoint",
    "model_name",
    "prompt_tokens",
    "completion_tokens",
    "wall_s",
)


def _merge_requests(writing: Session, source: Store) -> int:
    """Copy the request log rows the target lacks; returns how many."""
    key_columns = [RequestLog.__table__.columns[name] for name in _REQUEST_KEY]
    copied = [c for c in RequestLog.__table__.columns if c.name != "id"]
    present = {tuple(row) for row in writing.execute(select(*key_columns))}
    added = 0
    with source.session() as reading:
        rows = reading.execute(
            select(*copied)
            .order_by(RequestLog.started_at, RequestLog.id)
            .execution_options(yield_per=REQUESTS_PER_BATCH)
        )
        for batch in rows.partitions():
            new = []
            for row in batch:
                values = row._asdict()
                key = tuple(values[name] for name in _REQUEST_KEY)
                if key not in present:
                    present.add(key)
                    new.append(values)
            if new:
                writing.execute(insert(RequestLog), new)
                added += len(new)
    return added


def _progress(session: Session, run_id: str) -> tuple[bool, int] | None:
    """How far a run got, comparable across copies; None when the database lacks it."""
    state = session.scalar(select(Run.state).where(Run.id == run_id))
    if state is None:
        return None
    tasks = session.scalar(select(func.count()).where(TaskResult.run_id == run_id)) or 0
    return state == "complete", tasks


def _copy_run(reading: Session, writing: Session, run_id: str) -> None:
    writing.add(run_row(writing, reading.get_one(Run, run_id).to_record(), run_id))
    writing.flush()  # the run row must exist before its tasks reference it
    tasks = reading.scalars(
        select(TaskResult).where(TaskResult.run_id == run_id).order_by(TaskResult.id)
    )
    writing.add_all(TaskResult.from_record(run_id, task.to_record()) for task in tasks)
    writing.flush()
    # Trace chunks are copied packed, as they are; a chunk at a time keeps memory bounded.
    columns = [c for c in PowerTraceChunk.__table__.columns if c.name != "id"]
    chunks = reading.execute(
        select(*columns)
        .where(PowerTraceChunk.run_id == run_id)
        .order_by(PowerTraceChunk.id)
        .execution_options(yield_per=TRACE_CHUNKS_PER_BATCH)
    )
    for batch in chunks.partitions():
        writing.execute(insert(PowerTraceChunk), [row._asdict() for row in batch])
