"""The Store: records in, records out; the only code that reads or writes the results tables.

Each write commits at once, so a crash loses at most the task that was in flight.
"""

import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from operator import attrgetter
from types import TracebackType
from typing import Any, Self

from sqlalchemy import ColumnElement, Engine, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import QueryableAttribute, Session, sessionmaker

from openjarvis.errors import UserError
from openjarvis.records import HostRecord, PowerSampleRecord, RunRecord, TaskResultRecord
from openjarvis.store.liveness import refuse_if_live, this_process
from openjarvis.store.mapping import column_values
from openjarvis.store.models import (
    RUN_NAMES,
    RUN_STATES,
    Host,
    Model,
    PowerTraceChunk,
    Run,
    TaskResult,
)
from openjarvis.store.trace import (
    PowerSeries,
    pack_chunks,
    series_to_samples,
    sort_by_time,
    unpack_chunk,
)

__all__ = ["Store"]

FINAL_STATES = tuple(state for state in RUN_STATES if state != "running")
HEX_PREFIX = re.compile(r"[0-9a-f]{1,32}")


class Store:
    """The results database. Get one from `open_store()`; close it, or use it in a `with`."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._closed = False

    @property
    def url(self) -> str:
        """The database URL, with any password hidden, for messages."""
        return self._engine.url.render_as_string(hide_password=True)

    def close(self) -> None:
        self._engine.dispose()
        self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # Writes

    def upsert_host(self, host: HostRecord) -> None:
        """Record a machine once per fingerprint; a renamed host keeps its row."""
        self._write_retrying_races(lambda session: _host_id(session, host))

    def create_run(self, run: RunRecord) -> str:
        """Insert a run in state `running`, measured by this process, and return its new id
        (uuid4 hex)."""
        if run.state != "running":
            raise ValueError(f"a new run starts in state 'running', not {run.state!r}")
        run_id = uuid.uuid4().hex
        now = datetime.now(UTC)
        host, pid = this_process()
        started = replace(
            run,
            started_at=now,
            finished_at=None,
            process_host=host,
            process_pid=pid,
            heartbeat_at=now,
        )

        def write(session: Session) -> None:
            session.add(run_row(session, started, run_id))

        self._write_retrying_races(write)
        return run_id

    def set_idle_power(
        self, run_id: str, idle_power_w: dict[str, float | None], *, after: bool = False
    ) -> None:
        """Record the idle power per source: the baseline, or (`after`) the one measured when
        the run's tasks were done, which says how far idle drifted."""
        with self.session() as session:
            run = _existing_run(session, run_id)
            if after:
                run.idle_after_power_w = dict(idle_power_w)
            else:
                run.idle_power_w = dict(idle_power_w)

    def save_task_result(self, run_id: str, result: TaskResultRecord) -> None:
        """Save one task with its energy readings and commit; this is the run's heartbeat."""
        try:
            with self.session() as session:
                _existing_run(session, run_id).heartbeat_at = datetime.now(UTC)
                session.add(TaskResult.from_record(run_id, result))
        except IntegrityError:
            raise ValueError(f"task {result.task_id!r} is already saved in run {run_id}") from None

    def add_power_samples(self, run_id: str, samples: Sequence[PowerSampleRecord]) -> None:
        """Append trace samples, packed in chunks (store/trace.py): a million take under 1 s."""
        if not samples:
            return
        self._check_open()
        try:
            with self._engine.begin() as connection:
                connection.execute(insert(PowerTraceChunk), list(pack_chunks(run_id, samples)))
        except IntegrityError:
            raise ValueError(f"no run {run_id} to add power samples to") from None

    def finish_run(self, run_id: str, state: str, summary: dict[str, object] | None) -> None:
        """End a run in a final state with its summary."""
        if state not in FINAL_STATES:
            raise ValueError(f"a run finishes as one of {FINAL_STATES}, not {state!r}")
        with self.session() as session:
            run = _existing_run(session, run_id)
            run.state = state
            run.finished_at = datetime.now(UTC)
            run.summary = summary

    def resume_run(self, run_id: str) -> None:
        """Put an interrupted (or failed, or abandoned) run back in state `running`, measured by
        this process, for `--resume`; a run another process still measures is refused."""
        with self.session() as session:
            seen = _existing_run(session, run_id).to_record()
            refuse_if_live(seen)
            host, pid = this_process()
            # Claimed only if no other process claimed it since it was read: two processes
            # resuming at once cannot both win (a conditional UPDATE on any database).
            claim = (
                update(Run)
                .where(
                    Run.id == run_id,
                    Run.state == seen.state,
                    _equals(Run.process_host, seen.process_host),
                    _equals(Run.process_pid, seen.process_pid),
                    _equals(Run.heartbeat_at, seen.heartbeat_at),
                )
                .values(
                    state="running",
                    finished_at=None,
                    process_host=host,
                    process_pid=pid,
                    heartbeat_at=datetime.now(UTC),
                )
                .execution_options(synchronize_session=False)
            )
            claimed = session.execute(claim).rowcount == 1  # type: ignore[attr-defined]  # an UPDATE gives a CursorResult; SQLAlchemy types execute() as Result
        if not claimed:
            refuse_if_live(self.get_run(run_id))
            raise UserError(f"run {run_id} changed while it was being resumed; try again")

    # Reads: a run id may be given as a unique prefix, as users type it.

    def get_run(self, run_id: str) -> RunRecord:
        with self.session() as session:
            full_id = self._resolve_run_id(session, run_id)
            run = session.get_one(Run, full_id)
            return run.to_record()

    def saved_task_counts(self, run_ids: Sequence[str]) -> dict[str, int]:
        """How many tasks each run has saved (exact ids, as listed); 0 for runs with none."""
        query = (
            select(TaskResult.run_id, func.count())
            .where(TaskResult.run_id.in_(run_ids))
            .group_by(TaskResult.run_id)
        )
        with self.session() as session:
            counts = {run_id: count for run_id, count in session.execute(query)}
        return {run_id: counts.get(run_id, 0) for run_id in run_ids}

    def task_results(self, run_id: str) -> list[TaskResultRecord]:
        """The run's saved tasks, in the order they were saved, with their energy readings."""
        with self.session() as session:
            full_id = self._resolve_run_id(session, run_id)
            query = select(TaskResult).where(TaskResult.run_id == full_id).order_by(TaskResult.id)
            return [task.to_record() for task in session.scalars(query)]

    def list_runs(
        self,
        limit: int | None = 50,
        model: str | None = None,
        suite: str | None = None,
        host: str | None = None,
        since: datetime | None = None,
    ) -> list[RunRecord]:
        """Runs, newest first, filtered by model name, suite, host and start time.

        `host` matches a hostname exactly or a fingerprint by prefix, as users type them.
        """
        query = select(Run).order_by(Run.started_at.desc(), Run.id).limit(limit)
        if model is not None:
            query = query.where(Run.model_id.in_(select(Model.id).where(Model.name == model)))
        if suite is not None:
            query = query.where(Run.suite == suite)
        if host is not None:
            hosts = select(Host.id).where(
                or_(Host.hostname == host, Host.fingerprint.startswith(host.lower()))
            )
            query = query.where(Run.host_id.in_(hosts))
        if since is not None:
            query = query.where(Run.started_at >= since)
        with self.session() as session:
            return [run.to_record() for run in session.scalars(query)]

    def power_series(self, run_id: str) -> dict[str, PowerSeries]:
        """The run's power trace per source (sorted by name), as arrays ordered by time: what
        plotting needs, without a record per sample."""
        with self.session() as session:
            full_id = self._resolve_run_id(session, run_id)
            query = (
                select(PowerTraceChunk.source, PowerTraceChunk.times_s, PowerTraceChunk.power_w)
                .where(PowerTraceChunk.run_id == full_id)
                .order_by(PowerTraceChunk.source, PowerTraceChunk.start_s, PowerTraceChunk.id)
            )
            series: dict[str, PowerSeries] = {}
            for source, times_s, power_w in session.execute(query):
                times, watts = unpack_chunk(source, times_s, power_w)
                if source in series:
                    series[source][0].extend(times)
                    series[source][1].extend(watts)
                else:
                    series[source] = (times, watts)
        return {source: sort_by_time(*arrays) for source, arrays in series.items()}

    def power_samples(self, run_id: str) -> list[PowerSampleRecord]:
        """The run's power trace, ordered by time (ties: by source name, then as added)."""
        samples = series_to_samples(self.power_series(run_id))
        samples.sort(key=attrgetter("time_s"))  # stable: interleaves the sources
        return samples

    # Helpers

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the store is closed")

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction, committed on success and rolled back on error.

        Public for the store package's own modules (assistant, requests, merge), which keep
        their tables' SQL beside those tables; SQL outside store/ goes through Store methods.
        """
        self._check_open()
        with self._sessions.begin() as session:
            yield session

    def _write_retrying_races(self, write: Callable[[Session], object]) -> None:
        # Get-or-create of hosts and models can race with another writer on a shared database;
        # the loser's unique constraint fails, and a second try finds the winner's row.
        for attempt in range(2):
            try:
                with self.session() as session:
                    write(session)
                return
            except IntegrityError:
                if attempt == 1:
                    raise

    def _resolve_run_id(self, session: Session, prefix: str) -> str:
        candidate = prefix.strip().lower()
        matches = []
        if HEX_PREFIX.fullmatch(candidate):
            query = select(Run.id).where(Run.id.startswith(candidate)).limit(2)
            matches = list(session.scalars(query))
        if not matches:
            raise UserError(f"no run with id '{prefix}' in {self.url}; check the id and --db")
        if len(matches) > 1:
            raise UserError(f"run id '{prefix}' matches several runs; give more of the id")
        return matches[0]


def _equals(column: QueryableAttribute[Any], value: object) -> ColumnElement[bool]:
    return column.is_(None) if value is None else column == value


def _existing_run(session: Session, run_id: str) -> Run:
    # Writers hold the exact id create_run returned; a miss here is a bug, not a user's typo.
    run = session.get(Run, run_id)
    if run is None:
        raise ValueError(f"no run {run_id} in the store")
    return run


def run_row(session: Session, run: RunRecord, run_id: str) -> Run:
    """The row of `run` as the record has it (state, times, figures), with its host and model
    rows found or added: for new runs and for runs merged from another database."""
    return Run(
        id=run_id,
        host_id=_host_id(session, run.host) if run.host is not None else None,
        model_id=_model_id(session, run),
        **column_values(run, (name for name in RUN_NAMES if name != "id")),
    )


def _host_id(session: Session, host: HostRecord) -> int:
    existing = session.scalar(select(Host).where(Host.fingerprint == host.fingerprint))
    if existing is None:
        existing = Host.from_record(host)
        session.add(existing)
        session.flush()
    elif existing.hostname != host.hostname:
        existing.hostname = host.hostname  # the fingerprint leaves the hostname out on purpose
    return existing.id


def _model_id(session: Session, run: RunRecord) -> int:
    sha256_matches = (
        Model.sha256.is_(None) if run.model_sha256 is None else Model.sha256 == run.model_sha256
    )
    query = select(Model).where(Model.name == run.model_name, sha256_matches)
    model = session.scalar(query)
    if model is None:
        model = Model(name=run.model_name, sha256=run.model_sha256)
        session.add(model)
    # Fill what an earlier run did not know; never overwrite what it did.
    model.path = model.path or run.model_path
    model.quantisation = model.quantisation or run.model_quantisation
    if model.parameters is None:
        model.parameters = run.model_parameters
    if model.kind is None and model.kind_evidence is None:
        model.kind, model.kind_evidence = run.model_kind, run.model_kind_evidence
    session.flush()
    return model.id
