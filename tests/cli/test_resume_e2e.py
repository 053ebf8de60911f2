"""Interrupted runs: Ctrl-C and SIGTERM mark them interrupted and say how to resume, a killed
run shows as interrupted (process ended), a run still being measured cannot be resumed, and
--resume finishes a run without redoing a task, to the same accuracy figures as an uninterrupted
run (greedy decoding is deterministic).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from openjarvis.store import open_store
from tests.signals import default_sigint

pytestmark = pytest.mark.e2e

# --allow-shared: another measurement on this machine (a test elsewhere holding estimate:cpu)
# must not refuse these runs; what they check does not depend on the claim.
MEASURE = ["measure", "--limit", "3", "--idle-seconds", "1", "--json", "--allow-shared"]
# Long enough that the run is still going whatever the test does before it stops it.
MEASURE_LONG = ["measure", "--limit", "20", "--idle-seconds", "1", "--json", "--allow-shared"]


def _start(db: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "openjarvis", *args, "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=default_sigint,
    )


def _wait_for_first_task(db: Path, process: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert process.poll() is None, "the run ended before it could be interrupted"
        if db.exists():
            with open_store(str(db)) as store:
                runs = store.list_runs()
                if runs and store.task_results(runs[0].id or ""):
                    return runs[0].id or ""
        time.sleep(0.2)
    raise AssertionError("no task was saved within 300 s")


def _resume_line(run_id: str, tasks_saved: int, db: Path) -> str:
    return (
        f"interrupted: run {run_id} is marked interrupted with {tasks_saved} task(s) saved; "
        f"continue it with `ipw measure --resume {run_id} --db {db}`"
    )


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}


def test_sigkilled_run_resumes_to_the_figures_of_an_uninterrupted_run(
    tmp_path: Path, env: dict[str, str]
) -> None:
    killed_db = tmp_path / "killed.db"
    process = _start(killed_db, env, *MEASURE)
    run_id = _wait_for_first_task(killed_db, process)
    process.kill()
    process.wait()
    with open_store(str(killed_db)) as store:
        finished_before = len(store.task_results(run_id))
        assert store.get_run(run_id).state == "running"  # SIGKILL gave it no chance to say more
    assert 1 <= finished_before < 3
    # ... but its process is gone, and `ipw runs` and `ipw show` say so, with the saved tasks.
    listed = _start(killed_db, env, "runs", "--json")
    out, err = listed.communicate(timeout=120)
    assert listed.returncode == 0, err
    (row,) = json.loads(out)
    assert row["shown_state"] == "interrupted (process ended)"
    assert row["saved_tasks"] == finished_before
    shown = _start(killed_db, env, "show", run_id)
    out, err = shown.communicate(timeout=120)
    assert shown.returncode == 0, err
    assert "interrupted (process ended)" in out

    resumed = _start(killed_db, env, "measure", "--resume", run_id, "--json", "--allow-shared")
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    resumed_summary = json.loads(out)
    assert resumed_summary["resumed_tasks"] == finished_before

    whole = _start(tmp_path / "whole.db", env, *MEASURE)
    out, err = whole.communicate(timeout=600)
    assert whole.returncode == 0, err
    whole_summary = json.loads(out)

    for figure in ("tasks", "accuracy", "pass_at_k"):
        assert resumed_summary["figures"][figure] == whole_summary["figures"][figure]
    with open_store(str(killed_db)) as store:
        assert store.get_run(run_id).state == "complete"
        results = store.task_results(run_id)
    assert sorted(r.task_id for r in results) == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    with open_store(str(tmp_path / "whole.db")) as store:
        (whole_run,) = store.list_runs()
        expected = {r.task_id: r.completions for r in store.task_results(whole_run.id or "")}
    assert {r.task_id: r.completions for r in results} == expected


def test_ctrl_c_marks_the_run_interrupted_and_keeps_finished_tasks(
    tmp_path: Path, env: dict[str, str]
) -> None:
    db = tmp_path / "runs.db"
    process = _start(db, env, *MEASURE)
    run_id = _wait_for_first_task(db, process)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130
    assert "Traceback" not in err
    with open_store(str(db)) as store:
        assert store.get_run(run_id).state == "interrupted"
        saved = len(store.task_results(run_id))
    assert saved >= 1
    assert err.strip().splitlines()[-1] == _resume_line(run_id, saved, db)
    # --json: a program reading stdout gets the same news as JSON, not nothing.
    stopped = json.loads(out)
    assert (stopped["interrupted"], stopped["run_id"], stopped["tasks_saved"]) == (
        True,
        run_id,
        saved,
    )
    assert stopped["resume"] == f"ipw measure --resume {run_id} --db {db}"
    again = _start(db, env, "measure", "--resume", run_id, "--json", "--allow-shared")
    again.communicate(timeout=600)
    assert again.returncode == 0
    done = _start(db, env, "measure", "--resume", run_id, "--allow-shared")
    _, err = done.communicate(timeout=120)
    assert done.returncode == 2
    assert "already complete" in err


def test_a_live_run_cannot_be_resumed_and_sigterm_interrupts_it(
    tmp_path: Path, env: dict[str, str]
) -> None:
    db = tmp_path / "runs.db"
    process = _start(db, env, *MEASURE_LONG)
    run_id = _wait_for_first_task(db, process)

    with open_store(str(db)) as store:
        worker = store.get_run(run_id).process_pid  # the child that runs the engine
    second = _start(db, env, "measure", "--resume", run_id, "--allow-shared")
    _, err = second.communicate(timeout=120)
    assert second.returncode == 2
    assert err == (
        f"error: run {run_id} is still being measured by process {worker} on this machine; "
        f"let it finish, or stop it (Ctrl-C, or `kill {worker}`) and resume it then\n"
    )
    assert process.poll() is None  # the first process measures on, undisturbed

    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143
    assert "Traceback" not in err
    with open_store(str(db)) as store:
        run = store.get_run(run_id)
        saved = len(store.task_results(run_id))
    assert run.state == "interrupted"
    assert 1 <= saved < 20
    assert err.strip().splitlines()[-1] == _resume_line(run_id, saved, db)


def test_a_native_fault_mid_run_is_reported_and_the_run_resumes(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """A segfault in a native library (delivered here as the signal itself, to the process
    that runs the engine) ends the command with one line naming the run, the tasks saved and
    the resume command; Python's fault report goes to the file the line names."""
    db = tmp_path / "runs.db"
    process = _start(db, env, *MEASURE)
    run_id = _wait_for_first_task(db, process)
    with open_store(str(db)) as store:
        worker = store.get_run(run_id).process_pid
    assert worker is not None and worker != process.pid  # the engine runs in a child
    os.kill(worker, signal.SIGSEGV)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 70
    with open_store(str(db)) as store:
        saved = len(store.task_results(run_id))
    line = err.strip().splitlines()[-1]
    expected = (
        f"error: the engine's native code crashed (SIGSEGV) in run {run_id} with {saved} "
        f"task(s) saved; continue it with `ipw measure --resume {run_id} --db {db}`; "
        "fault report: "
    )
    assert line.startswith(expected), err
    assert "Fatal Python error" not in err and "Traceback" not in err
    report = Path(line.removeprefix(expected))
    assert "Fatal Python error: Segmentation fault" in report.read_text()
    resumed = _start(db, env, "measure", "--resume", run_id, "--json", "--allow-shared")
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    assert json.loads(out)["resumed_tasks"] >= 1
