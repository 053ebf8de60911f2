"""Records through the store and back: runs, tasks with energy, hosts, power traces, lookups.

None energies must come back as None (SQL NULL), never as 0. Each test runs on SQLite and
PostgreSQL (see conftest).
"""

from datetime import UTC, datetime
from itertools import pairwise

import pytest
from sqlalchemy import create_engine, text

from openjarvis.errors import UserError
from openjarvis.store import HostRecord, PowerSampleRecord, Store, open_store

__all__: list[str] = []


def scalar(url: str, sql: str) -> object:
    """One value read behind the store's back, through a connection of its own."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(text(sql)).scalar()
    finally:
        engine.dispose()


def test_run_tasks_and_energy_round_trip(store: Store, make_run, make_task) -> None:
    before = datetime.now(UTC)
    record = make_run()
    run_id = store.create_run(record)
    assert len(run_id) == 32 and int(run_id, 16) >= 0

    no_energy = make_task(
        "HumanEval/1",
        energy_j=None,
        net_energy_j=None,
        energy_null_reason="window-too-short",
        ttft_s=None,
        decode_tokens_per_s=None,
        energy=(),
    )
    store.save_task_result(run_id, make_task())
    store.save_task_result(run_id, no_energy)
    store.finish_run(run_id, "complete", {"accuracy": 0.5, "joules_per_solved_task": None})

    run = store.get_run(run_id)
    assert run.id == run_id
    assert run.state == "complete"
    assert run.started_at is not None and run.finished_at is not None
    assert run.started_at.tzinfo is not None and before <= run.started_at <= run.finished_at
    assert run.summary == {"accuracy": 0.5, "joules_per_solved_task": None}
    assert run.host == record.host
    assert run.idle_power_w == {"nvml:GPU-aaaa": 71.5, "nvml:GPU-bbbb": None}
    for name in (
        "model_name",
        "model_path",
        "model_sha256",
        "model_quantisation",
        "model_parameters",
        "engine",
        "engine_settings",
        "suite",
        "options",
        "energy_scope",
        "energy_method",
        "sandbox_isolation",
        "tool_version",
    ):
        assert getattr(run, name) == getattr(record, name), name

    assert store.task_results(run_id) == [make_task(), no_energy]
    second_energy = store.task_results(run_id)[0].energy[1]
    assert second_energy.energy_j is None and second_energy.null_reason == "permission"


def test_none_energy_is_stored_as_null(
    store: Store, database_url: str, make_run, make_task
) -> None:
    run_id = store.create_run(make_run())
    store.save_task_result(run_id, make_task(energy_j=None, net_energy_j=None))
    store.finish_run(run_id, "failed", None)
    assert scalar(database_url, "SELECT count(*) FROM task_result WHERE energy_j IS NULL") == 1
    assert scalar(database_url, "SELECT count(*) FROM energy_reading WHERE energy_j IS NULL") == 1
    assert scalar(database_url, "SELECT count(*) FROM run WHERE summary IS NULL") == 1
    assert store.get_run(run_id).summary is None


def test_task_saved_before_a_crash_is_readable(database_url: str, make_run, make_task) -> None:
    writer = open_store(database_url)
    run_id = writer.create_run(make_run())
    writer.save_task_result(run_id, make_task())
    # The writer never closes, as after a crash; a second connection must see the task.
    with open_store(database_url) as reader:
        assert [task.task_id for task in reader.task_results(run_id)] == ["HumanEval/0"]
        assert reader.get_run(run_id).state == "running"
    writer.close()


def test_host_upsert_is_idempotent(store: Store, database_url: str, host: HostRecord) -> None:
    store.upsert_host(host)
    store.upsert_host(host)
    assert scalar(database_url, "SELECT count(*) FROM host") == 1
    renamed = HostRecord(**{**{f: getattr(host, f) for f in host.__slots__}, "hostname": "new"})
    store.upsert_host(renamed)
    assert scalar(database_url, "SELECT count(*) FROM host") == 1
    assert scalar(database_url, "SELECT hostname FROM host") == "new"


def test_runs_share_host_and_model_rows(store: Store, database_url: str, make_run) -> None:
    store.create_run(make_run())
    store.create_run(make_run())
    store.create_run(make_run(model_sha256="cd" * 32))
    store.create_run(make_run(model_name="gpt-4o", model_path=None, model_sha256=None))
    store.create_run(make_run(model_name="gpt-4o", model_path=None, model_sha256=None))
    assert scalar(database_url, "SELECT count(*) FROM host") == 1
    assert scalar(database_url, "SELECT count(*) FROM model") == 3


def test_model_kind_is_stored_with_its_evidence_and_known_once_read(store: Store, make_run) -> None:
    older = store.create_run(make_run())  # stored before the kind was read: unknown
    assert store.get_run(older).model_kind is None
    evidence = "no tokenizer.chat_template, and no instruction tuning named (general.name 'x')"
    newer = store.create_run(make_run(model_kind="base", model_kind_evidence=evidence))
    # The kind belongs to the model file: its earlier runs now show it too.
    for run_id in (older, newer):
        run = store.get_run(run_id)
        assert (run.model_kind, run.model_kind_evidence) == ("base", evidence)
    # A run that could not read it leaves the known kind alone.
    unread = store.create_run(make_run(model_kind=None, model_kind_evidence="header unreadable"))
    assert store.get_run(unread).model_kind == "base"
    cloud = store.create_run(make_run(model_name="gpt-4o", model_path=None, model_sha256=None))
    assert store.get_run(cloud).model_kind is None


def test_run_without_host(store: Store, make_run) -> None:
    run_id = store.create_run(make_run(host=None))
    assert store.get_run(run_id).host is None


def test_run_id_prefix_lookup(store: Store, make_run) -> None:
    ids = [store.create_run(make_run()) for _ in range(20)]
    target = ids[0]
    others = ids[1:]
    length = 1
    while any(other.startswith(target[:length]) for other in others):
        length += 1
    assert store.get_run(target[:length]).id == target
    assert store.get_run(target.upper()).id == target
    assert len(store.task_results(target[:length])) == 0
    shared = next(c for c in "0123456789abcdef" if sum(i.startswith(c) for i in ids) > 1)
    with pytest.raises(UserError, match="several runs"):
        store.get_run(shared)
    with pytest.raises(UserError, match="no run with id"):
        store.get_run("")
    with pytest.raises(UserError, match="no run with id"):
        store.get_run("not-hex")
    missing = next(c for c in "0123456789abcdef" if not any(i.startswith(c) for i in ids))
    with pytest.raises(UserError, match="no run with id"):
        store.get_run(missing)


def test_writes_to_an_unknown_run_are_refused(store: Store, make_task) -> None:
    with pytest.raises(ValueError, match="no run"):
        store.save_task_result("0" * 32, make_task())
    with pytest.raises(ValueError, match="no run"):
        store.finish_run("0" * 32, "complete", None)


def test_same_task_twice_is_refused(store: Store, make_run, make_task) -> None:
    run_id = store.create_run(make_run())
    store.save_task_result(run_id, make_task())
    with pytest.raises(ValueError, match="already saved"):
        store.save_task_result(run_id, make_task())
    assert len(store.task_results(run_id)) == 1


def test_finish_and_resume(store: Store, make_run) -> None:
    with pytest.raises(ValueError):
        store.create_run(make_run(state="complete"))
    run_id = store.create_run(make_run(energy_method=None))
    with pytest.raises(ValueError):
        store.finish_run(run_id, "running", None)
    store.set_idle_power(run_id, {"nvml:GPU-aaaa": 70.0})
    store.finish_run(run_id, "interrupted", None)
    assert store.get_run(run_id).energy_method is None
    store.resume_run(run_id)
    resumed = store.get_run(run_id)
    assert (resumed.state, resumed.finished_at) == ("running", None)
    store.finish_run(run_id, "complete", {"accuracy": 1.0})
    finished = store.get_run(run_id)
    assert (finished.state, finished.summary) == ("complete", {"accuracy": 1.0})
    assert finished.finished_at is not None
    assert finished.idle_power_w == {"nvml:GPU-aaaa": 70.0}


def test_list_runs_newest_first_with_filters(store: Store, make_run) -> None:
    first = store.create_run(make_run("gemma", "humaneval"))
    second = store.create_run(make_run("gemma", "mmlu"))
    third = store.create_run(make_run("qwen", "humaneval"))
    assert [run.id for run in store.list_runs()] == [third, second, first]
    assert [run.id for run in store.list_runs(limit=2)] == [third, second]
    assert [run.id for run in store.list_runs(model="gemma")] == [second, first]
    assert [run.id for run in store.list_runs(suite="humaneval")] == [third, first]
    assert [run.id for run in store.list_runs(model="gemma", suite="humaneval")] == [first]
    assert store.list_runs(model="nope") == []


def test_power_samples_batch_of_100k(store: Store, make_run) -> None:
    run_id = store.create_run(make_run())
    samples = [
        PowerSampleRecord(f"nvml:GPU-{i % 2}", time_s=(i // 2) * 0.01, power_w=70.0 + i % 50)
        for i in range(100_000)
    ]
    store.add_power_samples(run_id, samples[50_000:])  # out of order: read back sorted by time
    store.add_power_samples(run_id, samples[:50_000])
    store.add_power_samples(run_id, [])
    stored = store.power_samples(run_id)
    assert len(stored) == 100_000
    assert stored[:2] == samples[:2] and stored[-1] == samples[-1]
    assert all(a.time_s <= b.time_s for a, b in pairwise(stored))
    assert store.power_samples(store.create_run(make_run())) == []


def test_power_series_are_per_source_arrays_in_time_order(store: Store, make_run) -> None:
    run_id = store.create_run(make_run())
    samples = [
        PowerSampleRecord(f"rapl:package-{i % 2}", time_s=(i // 2) * 0.5, power_w=float(i))
        for i in range(40_000)
    ]
    store.add_power_samples(run_id, samples[20_000:])  # later samples first
    store.add_power_samples(run_id, samples[:20_000])
    series = store.power_series(run_id)
    assert list(series) == ["rapl:package-0", "rapl:package-1"]
    for offset, source in enumerate(series):
        times, watts = series[source]
        assert list(times) == [(i // 2) * 0.5 for i in range(offset, 40_000, 2)]
        assert list(watts) == [float(i) for i in range(offset, 40_000, 2)]
    assert store.power_series(store.create_run(make_run())) == {}
    # Batches that overlap in time (odd seconds, then even ones) are merged by sorting.
    run_id = store.create_run(make_run())
    store.add_power_samples(
        run_id, [PowerSampleRecord("nvml:GPU-0", t, t) for t in range(1, 99, 2)]
    )
    store.add_power_samples(
        run_id, [PowerSampleRecord("nvml:GPU-0", t, t) for t in range(0, 99, 2)]
    )
    times, watts = store.power_series(run_id)["nvml:GPU-0"]
    assert list(times) == list(watts) == [float(t) for t in range(99)]


def test_closed_store_refuses_work(database_url: str, make_run) -> None:
    store = open_store(database_url)
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.create_run(make_run())
