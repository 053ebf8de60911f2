"""Concurrency in the store: a run's tasks in flight, and each task's and request's shared
energy with its mean batch; runs and requests stored before it read as one at a time."""

from datetime import UTC, datetime
from pathlib import Path

from openjarvis.store import Store, open_store
from openjarvis.store.requests import RequestLogRecord, log_request, request_logs
from tests.store.conftest import downgrade

__all__: list[str] = []


def request(**changes: object) -> RequestLogRecord:
    fields: dict[str, object] = {
        "started_at": datetime(2026, 12, 1, 12, tzinfo=UTC),
        "endpoint": "/v1/chat/completions",
        "model_name": "gemma",
        "engine": "torch",
        "stream": False,
        "prompt_tokens": 10,
        "completion_tokens": 20,
        "finish_reason": "stop",
        "wall_s": 1.0,
        "ttft_s": 0.1,
        "decode_tokens_per_s": 50.0,
        "energy_j": 12.0,
        "net_energy_j": 4.0,
        "energy_method": "counter",
        "energy_scope": "accelerator",
        "energy_null_reason": None,
    }
    fields.update(changes)
    return RequestLogRecord(**fields)  # type: ignore[arg-type]  # keyword values of mixed types


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
