"""Live runs: a run records the process that measures it and a heartbeat, so a `running` run whose
process is gone shows as interrupted, and resuming a run that is still measured is refused.

Processes are real (this one, children that exit, a sleeping child, a zombie); the store is SQLite
and PostgreSQL (see conftest).
"""

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest

from openjarvis.errors import UserError
from openjarvis.store import RunRecord, Store, ended_reason, refuse_if_live, shown_state
from openjarvis.store.liveness import this_process
from openjarvis.store.models import Run
from tests.store.conftest import task_result

__all__: list[str] = []


def set_process(
    store: Store, run_id: str, host: str | None, pid: int | None, heartbeat_at: datetime | None
) -> None:
    """Point a run at another process, as another machine or an earlier process left it."""
    with store.session() as session:
        run = session.get_one(Run, run_id)
        run.process_host, run.process_pid, run.heartbeat_at = host, pid, heartbeat_at


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not this one."""
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def ended_pid() -> int:
    """The pid of a process that has ended and been collected."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_new_run_records_this_process_and_beats_with_each_saved_task(
    store: Store, make_run: Callable[..., RunRecord]
) -> None:
    before = datetime.now(UTC)
    run_id = store.create_run(make_run())
    run = store.get_run(run_id)
    assert (run.process_host, run.process_pid) == this_process()
    assert run.heartbeat_at is not None and run.heartbeat_at >= before
    assert ended_reason(run) is None and shown_state(run) == "running"

    set_process(store, run_id, *this_process(), before - timedelta(hours=1))
    store.save_task_result(run_id, task_result())
    beat = store.get_run(run_id).heartbeat_at
    assert beat is not None and beat >= before


def test_a_run_whose_process_ended_shows_interrupted_and_can_be_resumed(
    store: Store, make_run: Callable[..., RunRecord]
) -> None:
    run_id = store.create_run(make_run())
    store.save_task_result(run_id, task_result())
    host, _ = this_process()
    set_process(store, run_id, host, ended_pid(), datetime.now(UTC))
    run = store.get_run(run_id)
    assert run.state == "running"
    assert shown_state(run) == "interrupted (process ended)"
    refuse_if_live(run)  # no error

    store.resume_run(run_id)
    resumed = store.get_run(run_id)
    assert resumed.state == "running"
    assert (resumed.process_host, resumed.process_pid) == this_process()
    assert shown_state(resumed) == "running"


def test_resuming_a_run_another_live_process_measures_is_refused(
    store: Store, make_run: Callable[..., RunRecord], sleeper: subprocess.Popen[bytes]
) -> None:
    run_id = store.create_run(make_run())
    host, _ = this_process()
    set_process(store, run_id, host, sleeper.pid, datetime.now(UTC))
    with pytest.raises(UserError, match=f"still being measured by process {sleeper.pid}") as caught:
        store.resume_run(run_id)
    assert "\n" not in str(caught.value)
    run = store.get_run(run_id)
    assert run.process_pid == sleeper.pid  # the claim did not happen
    assert shown_state(run) == "running"


def test_a_pid_reused_by_a_later_process_does_not_keep_a_run_alive(
    store: Store, make_run: Callable[..., RunRecord], sleeper: subprocess.Popen[bytes]
) -> None:
    # The sleeper started now; a heartbeat a minute old cannot have come from it.
    run_id = store.create_run(make_run())
    host, _ = this_process()
    set_process(store, run_id, host, sleeper.pid, datetime.now(UTC) - timedelta(minutes=1))
    assert shown_state(store.get_run(run_id)) == "interrupted (process ended)"


def test_a_zombie_process_has_ended(
    store: Store, make_run: Callable[..., RunRecord], sleeper: subprocess.Popen[bytes]
) -> None:
    run_id = store.create_run(make_run())
    host, _ = this_process()
    set_process(store, run_id, host, sleeper.pid, datetime.now(UTC))
    sleeper.kill()  # not collected yet: the pid is a zombie until wait()
    deadline = datetime.now(UTC) + timedelta(seconds=10)
    while shown_state(store.get_run(run_id)) == "running" and datetime.now(UTC) < deadline:
        time.sleep(0.05)  # the kill is delivered asynchronously
    assert shown_state(store.get_run(run_id)) == "interrupted (process ended)"


def test_another_host_counts_as_live_while_its_heartbeat_is_recent(
    store: Store, make_run: Callable[..., RunRecord]
) -> None:
    run_id = store.create_run(make_run())
    set_process(store, run_id, "other-box", 4242, datetime.now(UTC) - timedelta(minutes=5))
    run = store.get_run(run_id)
    assert shown_state(run) == "running"
    with pytest.raises(UserError, match=r"process 4242 on other-box \(last heartbeat 5 min ago\)"):
        store.resume_run(run_id)

    set_process(store, run_id, "other-box", 4242, datetime.now(UTC) - timedelta(minutes=31))
    assert shown_state(store.get_run(run_id)) == "interrupted (no heartbeat for 31 min)"
    store.resume_run(run_id)
    assert store.get_run(run_id).process_pid == this_process()[1]


def test_a_run_without_a_recorded_process_is_resumable(
    store: Store, make_run: Callable[..., RunRecord]
) -> None:
    run_id = store.create_run(make_run())
    set_process(store, run_id, None, None, None)  # as an OpenJarvis before heartbeats left it
    assert shown_state(store.get_run(run_id)) == "interrupted (process unknown)"
    store.resume_run(run_id)
    assert store.get_run(run_id).state == "running"


def test_states_other_than_running_are_shown_as_stored(
    store: Store, make_run: Callable[..., RunRecord]
) -> None:
    run_id = store.create_run(make_run())
    set_process(store, run_id, *this_process(), datetime.now(UTC))
    store.finish_run(run_id, "interrupted", None)
    run = store.get_run(run_id)
    assert ended_reason(run) is None and shown_state(run) == "interrupted"


def test_saved_task_counts(store: Store, make_run: Callable[..., RunRecord]) -> None:
    first, second = store.create_run(make_run()), store.create_run(make_run())
    for task_id in ("A/0", "A/1", "A/2"):
        store.save_task_result(first, task_result(task_id))
    assert store.saved_task_counts([first, second]) == {first: 3, second: 0}
