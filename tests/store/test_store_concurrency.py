"""Migrations 0007 and 0008: a run's tasks in flight, each task's and request's shared energy
with its mean batch (runs and requests stored before read as one at a time), and host core
counts that may be unknown."""

import dataclasses
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from openjarvis.errors import UserError
from openjarvis.store import Store, open_store
from openjarvis.store.requests import RequestLogRecord, log_request, request_logs
from tests.store.conftest import downgrade

__all__: list[str] = []


def request(**changes: Any) -> RequestLogRecord:
    logged = RequestLogRecord(
        started_at=datetime(2026, 12, 1, 12, tzinfo=UTC),
        endpoint="/v1/chat/completions",
        model_name="gemma",
        engine="torch",
        stream=False,
        prompt_tokens=10,
        completion_tokens=20,
        finish_reason="stop",
        wall_s=1.0,
        ttft_s=0.1,
        decode_tokens_per_s=50.0,
        energy_j=12.0,
        net_energy_j=4.0,
        energy_method="counter",
        energy_scope="accelerator",
        energy_null_reason=None,
    )
    return dataclasses.replace(logged, **changes)


def test_concurrency_and_shared_energy_round_trip(store: Store, make_run, make_task) -> None:
    run_id = store.create_run(make_run(concurrency=8))
    store.save_task_result(run_id, make_task("HumanEval/0", shared=True, mean_batch=6.5))
    store.save_task_result(run_id, make_task("HumanEval/1"))
    assert store.get_run(run_id).concurrency == 8
    shared, alone = store.task_results(run_id)
    assert (shared.shared, shared.mean_batch) == (True, 6.5)
    assert (alone.shared, alone.mean_batch) == (False, None)

    log_request(store, request(shared=True, mean_batch=3.25))
    log_request(store, request())
    assert [(r.shared, r.mean_batch) for r in request_logs(store)] == [(True, 3.25), (False, None)]


def test_runs_tasks_and_requests_stored_before_read_as_one_at_a_time(
    db_path: Path, make_run, make_task
) -> None:
    with open_store(str(db_path)) as store:
        run_id = store.create_run(make_run())
        store.save_task_result(run_id, make_task())
        log_request(store, request())
    downgrade(db_path, "0006_model_kind")  # as the OpenJarvis before concurrency left it
    with open_store(str(db_path)) as store:
        assert store.get_run(run_id).concurrency == 1
        (task,) = store.task_results(run_id)
        assert (task.shared, task.mean_batch) == (False, None)
        assert [(r.shared, r.mean_batch) for r in request_logs(store)] == [(False, None)]


def test_core_counts_may_be_null_and_hosts_with_runs_survive_the_rebuild(
    db_path: Path, make_run, host
) -> None:
    """SQLite rebuilds `host` to make its core counts nullable; a run points at the host, so
    foreign keys must be off around the migration, and every reference holds after it."""
    unknown = dataclasses.replace(host, cpu_physical_cores=0, fingerprint="feed")
    with open_store(str(db_path)) as store:
        known_run = store.create_run(make_run())
        unknown_run = store.create_run(make_run(host=unknown))
    downgrade(db_path, "0007_concurrency")  # cores NOT NULL, the unknown one stored as 0
    with open_store(str(db_path)) as store:
        assert store.get_run(known_run).host == host
        assert store.get_run(unknown_run).host == unknown  # kept as it was stored
        new_run = store.create_run(
            make_run(host=dataclasses.replace(host, fingerprint="cafe", cpu_logical_cores=None))
        )
        stored = store.get_run(new_run).host
        assert stored is not None and stored.cpu_logical_cores is None
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("PRAGMA foreign_key_check").fetchall() == []
        assert raw.execute("SELECT count(*) FROM run").fetchone() == (3,)


def test_a_migration_that_breaks_a_reference_is_refused_and_rolled_back(
    db_path: Path, make_run
) -> None:
    with open_store(str(db_path)) as store:
        run_id = store.create_run(make_run())
    downgrade(db_path, "0007_concurrency")
    with sqlite3.connect(db_path) as raw:  # a run pointing at a host that is not there
        raw.execute("PRAGMA foreign_keys = OFF")
        raw.execute("UPDATE run SET host_id = 999")
    with pytest.raises(UserError, match=r"references are broken \(run\)"):
        open_store(str(db_path))
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("SELECT version_num FROM alembic_version").fetchone() == (
            "0007_concurrency",
        )
        assert raw.execute("SELECT id FROM run").fetchone() == (run_id,)
