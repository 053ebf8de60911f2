"""Merging results databases: everything of a run arrives, and merging again changes nothing.

The target is SQLite or PostgreSQL (see conftest); sources are SQLite files, as exported.
"""

from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from openjarvis.store import Store, merge_into, open_store
from tests.synthetic import add_run, make_host

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
        laptop.save_task_result(run_id, type(extra)(**{**_fields(extra), "task_id": "Extra/1"}))
        laptop.finish_run(run_id, "complete", {"tasks": 4})
        counts = merge_into(store, laptop)
        assert (counts.added, counts.replaced, counts.unchanged) == (0, 1, 0)
        assert_same_run(store, laptop, run_id)
        # The stale copy never downgrades the finished one.
        assert merge_into(store, stale).unchanged == 1
        assert_same_run(store, laptop, run_id)


def _fields(record: object) -> dict[str, object]:
    return {name: getattr(record, name) for name in record.__slots__}  # type: ignore[attr-defined]


def test_merging_a_database_into_itself_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="into itself"):
        merge_into(store, store)
