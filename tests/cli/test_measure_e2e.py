"""`ipw measure` end to end: the real embedded model, the real sandbox, a temporary database."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from openjarvis.power import rapl
from openjarvis.store import open_store

pytestmark = pytest.mark.e2e


def run_ipw(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openjarvis", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"), "COLUMNS": "120"}


def test_measure_two_tasks_stores_rows_and_prints_figures(
    tmp_path: Path, env: dict[str, str]
) -> None:
    db = tmp_path / "runs.db"
    done = run_ipw("measure", "--limit", "2", "--idle-seconds", "2", "--db", str(db), env=env)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for figure in (
        "accuracy (pass@1)",
        "mean J per task",
        "accuracy per joule",
        "mean W",
        "decode tokens/s",
        "energy method · scope",
    ):
        assert figure in out
    # The embedded model is a base model: HumanEval is put to it as code to continue.
    assert "completion · base model" in out
    with open_store(str(db)) as store:
        runs = store.list_runs()
        assert len(runs) == 1
        run = runs[0]
        assert run.state == "complete"
        assert run.model_name == "gemma-3-270m-Q4_K_M"
        assert run.model_parameters is not None and 2e8 < run.model_parameters < 3e8  # 270M
        assert run.model_kind == "base" and "no tokenizer.chat_template" in str(
            run.model_kind_evidence
        )
        assert run.options["prompting"] == {"code": "completion"}
        results = store.task_results(run.id or "")
    assert [r.task_id for r in results] == ["HumanEval/0", "HumanEval/1"]
    for result in results:
        assert result.completion_tokens > 0
        assert result.latency_s > 0
        # The tests ran and judged the completion: a sandbox that failed to start ("error")
        # or never returned would not be a score.
        assert result.statuses[0] in ("passed", "failed")
        # Energy is measured or estimated, never silently 0: known and positive, or null+reason.
        if result.energy_j is None:
            assert result.energy_null_reason
        else:
            assert result.energy_j > 0
            assert all(e.method in ("counter", "integrated", "estimate") for e in result.energy)
    # The printed method is the run's stored method.
    assert str(run.energy_method) in out


def test_measure_json_prints_the_same_figures(tmp_path: Path, env: dict[str, str]) -> None:
    db = tmp_path / "runs.db"
    done = run_ipw(
        "measure", "--limit", "1", "--idle-seconds", "1", "--db", str(db), "--json", env=env
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    figures = summary["figures"]
    assert figures["tasks"] == 1
    assert summary["energy_scope"] == "system"
    assert summary["model_kind"] == "base" and summary["prompting"] == {"code": "completion"}
    assert summary["energy_method"] in ("counter", "integrated", "estimate")
    apj = figures["accuracy_per_joule"]
    assert apj["value"] is not None or apj["null_reason"]
    # The windows add up to the counters over the run (no joule lost between tasks), and the
    # energy is split at the first token into prefill and decode.
    assert summary["conservation"]["ratio"] == pytest.approx(1.0, abs=0.01)
    assert summary["window_flags"]["tasks"] == 1
    assert summary["phase_energy"]["decode_j_per_output_token"] > 0
    with open_store(str(db)) as store:
        (run,) = store.list_runs()
        assert run.summary is not None
        assert run.summary["accuracy"] == figures["accuracy"]
        assert run.idle_after_power_w  # idle measured again after the tasks: drift is known
        (task,) = store.task_results(run.id or "")
    assert task.prefill_energy_j is not None and task.decode_energy_j is not None
    assert task.energy_j is not None
    assert task.prefill_energy_j + task.decode_energy_j == pytest.approx(task.energy_j)
    assert task.tail_energy_j is not None  # settled: the tail up to the run's end


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "/nonexistent/model.gguf"], "model file not found"),
        (["--suite", "nosuch"], "unknown suite"),
        (["--limit", "0"], "--limit must be at least 1"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_rows(
    tmp_path: Path, env: dict[str, str], args: list[str], message: str
) -> None:
    db = tmp_path / "runs.db"
    done = run_ipw("measure", "--db", str(db), *args, env=env)
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr
    assert not db.exists() or _run_count(db) == 0


def test_non_gguf_model_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_text("this is not a model")
    done = run_ipw("measure", "--model", str(fake), "--db", str(tmp_path / "x.db"), env=env)
    assert done.returncode == 2
    assert "not a GGUF model file" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_unwritable_database_path_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("a file where a folder should be")
    done = run_ipw("measure", "--db", str(blocker / "ipw.db"), env=env)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def _run_count(db: Path) -> int:
    with open_store(str(db)) as store:
        return len(store.list_runs())


def test_a_second_measurement_of_the_same_sources_is_refused_or_marked_shared(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """Another process holding this machine's CPU source (as a running `ipw measure` does):
    the run refuses with one line, or, with --allow-shared, runs and says shared-machine. The
    CPU source is the estimate on any host: the run reads an empty powercap tree, not /sys."""
    (tmp_path / "sys" / "class" / "powercap").mkdir(parents=True)
    env = {**env, rapl.SYSFS_ROOT_ENV: str(tmp_path / "sys")}
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from openjarvis.power.claims import claim_sources; "
            "claim = claim_sources(['estimate:cpu'], 'ipw measure in a test'); "
            "print('held', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        db = tmp_path / "runs.db"
        refused = run_ipw(
            "measure", "--limit", "1", "--idle-seconds", "0", "--db", str(db), env=env
        )
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines() == [
            f"error: another measurement holds estimate:cpu (pid {holder.pid}: ipw measure in a "
            "test): both would claim its joules; wait for it to finish, or pass --allow-shared "
            "to measure anyway (the run is then marked shared-machine)"
        ]
        shared = run_ipw(
            "measure", "--limit", "1", "--idle-seconds", "0", "--allow-shared", "--json",
            "--db", str(db), env=env,
        )  # fmt: skip
        assert shared.returncode == 0, shared.stderr
        assert "shared-machine" in json.loads(shared.stdout)["energy_note"]
        with open_store(str(db)) as store:
            (run,) = store.list_runs()
        assert run.options["shared_machine"] == ["estimate:cpu"]
    finally:
        holder.kill()
        holder.wait()
