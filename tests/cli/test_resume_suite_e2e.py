"""--resume reads the run's stored configuration back, and refuses a suite that changed since
the run started: one line, exit 2, the run as it was. The real embedded model answers."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openjarvis.cli import supervise
from openjarvis.cli.ipw import app
from openjarvis.errors import RunInterrupted
from openjarvis.evals.config import RunConfig, prepare
from openjarvis.evals.runner import ProgressCallback, run_measure
from openjarvis.evals.suites import SuiteConfig
from openjarvis.store import open_store
from tests.evals.test_run_config import TASKS, write_suite

__all__: list[str] = []


# Four short tasks: Ctrl-C after the first is saved leaves some to resume.
FOUR = [*TASKS, *(line.replace('"add"', f'"add{i}"') for i, line in enumerate(TASKS[:1] * 2))]


def interrupt_once() -> ProgressCallback:
    calls: list[str] = []

    def on_task(task_id: str, passed: int, samples: int) -> None:
        calls.append(task_id)
        if len(calls) == 1:
            raise KeyboardInterrupt  # as Ctrl-C does, once the first task is saved

    return on_task


@pytest.mark.e2e
def test_resume_after_the_suite_file_changed_is_refused_and_otherwise_continues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    suite_path = write_suite(tmp_path / "suites", FOUR)
    db = str(tmp_path / "runs.db")
    monkeypatch.chdir(tmp_path)
    config = RunConfig(
        suite=SuiteConfig("suites/good.jsonl", limit=None), idle_seconds=0, allow_shared=True
    )
    with pytest.raises(RunInterrupted) as stopped:
        run_measure(prepare(config), db, on_task=interrupt_once())
    run_id = stopped.value.run_id
    with open_store(db) as store:
        run = store.get_run(run_id)
    assert run.suite == "good.jsonl" and run.suite_sha256 is not None
    assert run.config is not None
    assert run.config["suite"] == {"name": str(suite_path), "limit": None, "lm_eval": None}
    shown = CliRunner().invoke(app, ["show", run_id, "--db", db], env={"COLUMNS": "400"})
    assert shown.exit_code == 0, shown.output
    assert f"good.jsonl (sha256 {run.suite_sha256})" in shown.output  # ipw show: the identity
    as_json = CliRunner().invoke(app, ["show", run_id, "--db", db, "--json"])
    assert json.loads(as_json.output)["run"]["config"] == run.config  # and the configuration

    saved = stopped.value.tasks_saved
    assert 1 <= saved < 4
    edited = [*FOUR[:3], FOUR[3].replace("1 + 1", "2 + 2")]  # past the tasks already run
    suite_path.write_text("\n".join(edited) + "\n")
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}

    def resume() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "openjarvis", "measure", "--resume", run_id, "--db", db],
            capture_output=True,
            text=True,
            env=env,
            cwd="/",  # another folder than the run's: the stored path is absolute
            timeout=600,
        )

    refused = resume()
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines() == [
        f"error: suite good.jsonl changed since run {run_id} started (its tasks hash "
        "differently); start a new run instead of resuming"
    ]
    with open_store(db) as store:
        assert store.get_run(run_id).state == "interrupted"
        assert len(store.task_results(run_id)) == saved

    write_suite(tmp_path / "suites", FOUR)  # as it was: the same suite again
    resumed = resume()
    assert resumed.returncode == 0, resumed.stderr
    with open_store(db) as store:
        assert store.get_run(run_id).state == "complete"
        assert [r.task_id for r in store.task_results(run_id)] == ["add", "sub", "add0", "add1"]


def test_a_supervised_child_announces_its_run_through_the_pipe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The parent learns the run from what the child says, not from the pid or argv."""
    read_end, write_end = os.pipe()
    monkeypatch.setenv(supervise._RUN_PIPE_ENV, str(write_end))
    supervise.announce_run("first", None)
    supervise.announce_run("3f2a", "postgresql://h/db")  # a resume after the first: the last
    os.close(write_end)
    assert supervise._announced_run(read_end) == ("3f2a", "postgresql://h/db")
    empty_read, empty_write = os.pipe()
    os.close(empty_write)
    assert supervise._announced_run(empty_read) is None
    line = supervise._crash_line("SIGSEGV", None)
    assert line == "the engine's native code crashed (SIGSEGV) before the run was recorded; " + (
        "nothing was saved"
    )


def test_announcing_outside_a_supervisor_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(supervise._RUN_PIPE_ENV, raising=False)
    supervise.announce_run("3f2a", None)  # no pipe, no error
