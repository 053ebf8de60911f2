"""Merging results databases: everything of a run arrives, and merging again changes nothing;
sources are only read, checked first, and a merge of several is all or nothing.

The target is SQLite or PostgreSQL (see conftest); sources are SQLite files, as exported.
"""

import dataclasses
import hashlib
import random
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError, OperationalError

from openjarvis.errors import UserError
from openjarvis.store import (
    Store,
    log_request,
    merge_all,
    merge_into,
    open_merge_source,
    open_store,
    request_logs,
)
from tests.store.conftest import downgrade
from tests.synthetic import add_run, logged_request, make_host

__all__: list[str] = []

H200 = make_host("h200-box", gpus=("NVIDIA H200 (GPU-aaaa)",))
LAPTOP = make_host("laptop")
TABLES = ("host", "model", "run", "task_result", "energy_reading", "power_trace_chunk")


def row_counts(url: str) -> dict[str, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return {
                table: connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
                for table in TABLES
            }
    finally:
        engine.dispose()


@pytest.fixture
def laptop_db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'laptop.db'}"


def assert_same_run(target: Store, source: Store, run_id: str) -> None:
    assert target.get_run(run_id) == source.get_run(run_id)
    assert target.task_results(run_id) == source.task_results(run_id)
    assert target.power_samples(run_id) == source.power_samples(run_id)


def test_merge_copies_runs_and_is_idempotent(store: Store, database_url: str, laptop_db: str):
    here = add_run(store, H200, "gemma", tasks=5, seed=1)
    with open_store(laptop_db) as laptop:
        # Same model file as the H200 run: the model row is shared, the host is new.
        theirs = [
            add_run(laptop, LAPTOP, "gemma", tasks=7, trace_samples=20_000, seed=2),
            add_run(laptop, LAPTOP, "qwen", tasks=3, method="estimate", seed=3),
            add_run(laptop, LAPTOP, "qwen", tasks=2, state="interrupted", seed=4),
        ]
        counts = merge_into(store, laptop)
        assert (counts.added, counts.replaced, counts.unchanged) == (3, 0, 0)
        for run_id in theirs:
            assert_same_run(store, laptop, run_id)
        after_first = row_counts(database_url)
        assert after_first["host"] == 2 and after_first["model"] == 2 and after_first["run"] == 4

        again = merge_into(store, laptop)
        assert (again.added, again.replaced, again.unchanged) == (0, 0, 3)
        assert row_counts(database_url) == after_first
    assert {run.id for run in store.list_runs()} == {here, *theirs}


def test_a_run_that_got_further_replaces_its_earlier_copy(
    store: Store, laptop_db: str, tmp_path: Path
) -> None:
    with open_store(laptop_db) as laptop, open_store(str(tmp_path / "stale.db")) as stale:
        run_id = add_run(laptop, LAPTOP, tasks=3, state="interrupted")
        merge_into(store, laptop)
        merge_into(stale, laptop)  # a copy taken while the run was interrupted
        assert store.get_run(run_id).state == "interrupted"
        # The laptop resumes and finishes the run; merging again brings the finished copy.
        laptop.resume_run(run_id)
        extra = laptop.task_results(run_id)[0]
        laptop.save_task_result(run_id, dataclasses.replace(extra, task_id="Extra/1"))
        laptop.finish_run(run_id, "complete", {"tasks": 4})
        counts = merge_into(store, laptop)
        assert (counts.added, counts.replaced, counts.unchanged) == (0, 1, 0)
        assert_same_run(store, laptop, run_id)
        # The stale copy never downgrades the finished one.
        assert merge_into(store, stale).unchanged == 1
        assert_same_run(store, laptop, run_id)


def test_merging_a_database_into_itself_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="into itself"):
        merge_into(store, store)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_source_is_read_only_and_left_byte_identical(store: Store, tmp_path: Path) -> None:
    source = tmp_path / "laptop.db"
    with open_store(str(source)) as laptop:
        run_id = add_run(laptop, LAPTOP, tasks=3, trace_samples=50)
    before = sha256_of(source)
    with open_merge_source(str(source)) as laptop:
        with pytest.raises(OperationalError, match="readonly"):
            laptop.finish_run(run_id, "failed", None)
        assert merge_all(store, [laptop])[0].added == 1
    assert sha256_of(source) == before
    assert store.task_results(run_id)


def test_a_source_with_an_older_schema_is_upgraded_in_a_copy(store: Store, tmp_path: Path) -> None:
    source = tmp_path / "old.db"
    with open_store(str(source)) as laptop:
        run_id = add_run(laptop, LAPTOP, tasks=2)
    downgrade(source, "0004_request_log")
    before = sha256_of(source)
    with open_merge_source(str(source)) as laptop:
        merge_into(store, laptop)
    assert sha256_of(source) == before
    with sqlite3.connect(source) as raw:
        assert raw.execute("SELECT version_num FROM alembic_version").fetchone()[0] == (
            "0004_request_log"
        )
    assert len(store.task_results(run_id)) == 2


def damage(path: Path) -> None:
    """Overwrite a page in the middle (task data, far from the schema) with noise, as a failing
    disk might: only reading the whole file finds it."""
    middle = path.stat().st_size // 2 // 4096 * 4096
    with path.open("r+b") as file:
        file.seek(middle)
        file.write(random.Random(0).randbytes(4096))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda path: sqlite3.connect(path).execute("CREATE TABLE foo (x)"), "not an OpenJarvis"),
        (lambda path: path.write_text("name,joules\n" * 500), r"not an OpenJarvis .*not SQLite"),
        (None, "is damaged"),
    ],
    ids=["foreign-sqlite", "text", "damaged"],
)
def test_a_source_that_is_not_ours_or_is_damaged_is_refused_untouched(
    tmp_path: Path, make: Callable[[Path], object] | None, message: str
) -> None:
    source = tmp_path / "source.db"
    if make is None:
        with open_store(str(source)) as good:
            add_run(good, LAPTOP, tasks=40, trace_samples=2000)
        damage(source)
    else:
        make(source)
    before = sha256_of(source)
    with pytest.raises(UserError, match=message) as caught, open_merge_source(str(source)):
        pass
    assert "\n" not in str(caught.value)
    assert sha256_of(source) == before
    with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as raw:
        if make is not None and message == "not an OpenJarvis":
            tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_master")}
            assert tables == {"foo"}


def test_merging_several_sources_is_all_or_nothing(tmp_path: Path) -> None:
    first, second = tmp_path / "first.db", tmp_path / "second.db"
    with open_store(str(first)) as laptop:
        add_run(laptop, LAPTOP, tasks=3, seed=1)
    with open_store(str(second)) as h200:
        failing = add_run(h200, H200, tasks=3, seed=2)
    target_path = tmp_path / "target.db"
    with open_store(str(target_path)) as target:
        kept = add_run(target, H200, tasks=1, seed=3)
    # The target refuses the second source's run half way, as a full disk or a constraint would.
    with sqlite3.connect(target_path) as raw:
        raw.execute(
            f"CREATE TRIGGER refuse BEFORE INSERT ON run WHEN NEW.id = '{failing}' "
            "BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
    with (
        open_store(str(target_path)) as target,
        open_merge_source(str(first)) as one,
        open_merge_source(str(second)) as two,
    ):
        with pytest.raises(IntegrityError, match="refused"):
            merge_all(target, [one, two])
        assert [run.id for run in target.list_runs()] == [kept]
    assert row_counts(f"sqlite:///{target_path}")["task_result"] == 1


def test_the_request_log_travels_with_a_merge_once(store: Store, laptop_db: str) -> None:
    """`jarvis serve`'s request log is copied (its rows have no id shared across databases: they
    match by when they started and what they were), and merging again adds none."""
    start = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    log_request(store, logged_request("gemma", 5, start))  # the target's own request
    with open_store(laptop_db) as laptop:
        theirs = [logged_request("gemma", n, start + timedelta(seconds=n)) for n in (5, 8, 13)]
        for record in theirs:
            log_request(laptop, record)
        counts = merge_into(store, laptop)
        # The first of theirs started at another second than the target's own: all three new.
        assert counts.requests_added == 3
        assert merge_into(store, laptop).requests_added == 0
        merged = request_logs(store)
    assert len(merged) == 4
    assert [(r.completion_tokens, r.shared, r.energy_j) for r in merged[1:]] == [
        (5, False, 15.0),
        (8, True, 24.0),
        (13, False, 39.0),
    ]
