"""`ipw measure --engine torch`: the torch engine on the embedded GGUF, end to end (CPU here)."""

import os
import subprocess
from pathlib import Path

import pytest

from openjarvis.store import open_store
from tests.cli.test_measure_e2e import run_ipw
from tests.cli.test_measure_energy_e2e import (  # steady_machine_files: a fixture used by name
    DRAM_W,
    PACKAGE_W,
    TOLERANCE,
    steady_machine_files,  # noqa: F401
)

pytest.importorskip("torch")
pytest.importorskip("gguf")
pytestmark = pytest.mark.e2e


def _ipw(*args: str) -> subprocess.CompletedProcess[str]:
    return run_ipw(*args, env={**os.environ, "COLUMNS": "120"})  # data folder: conftest's


@pytest.mark.usefixtures("steady_machine_files")
def test_torch_engine_measures_and_stores_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU on every host (no GPU visible to torch or NVML), metered by the fake RAPL
    counter of known power (test_measure_energy_e2e.py), which the command reads too."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    db = tmp_path / "runs.db"
    # --allow-shared: another measurement on this machine (a test elsewhere) must not fail it.
    done = _ipw(
        "measure", "--engine", "torch", "--limit", "1", "--idle-seconds", "0", "--allow-shared",
        "--db", str(db),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "accuracy (pass@1)" in done.stdout
    with open_store(str(db)) as store:
        (run,) = store.list_runs()
        (result,) = store.task_results(run.id or "")
    assert run.state == "complete"
    assert run.engine == "torch"
    assert run.model_name == "gemma-3-270m-Q4_K_M"
    assert run.engine_settings["tp"] == 1
    # One task at a time: the engine holds KV cache (and on a GPU graphs) for one sequence.
    assert run.engine_settings["concurrency"] == 1
    assert run.engine_settings["kv_cache_blocks"] == 1 + 4096 // 16
    assert run.engine_settings["device"] == "cpu"
    assert result.completion_tokens > 0
    assert result.statuses[0] in ("passed", "failed")  # the sandbox ran the tests and judged
    # The meter read the counters, and the task drew their known power over its window.
    assert run.energy_method == "counter"
    assert {reading.source for reading in result.energy} == {"rapl:package-0", "rapl:dram-0"}
    watts = PACKAGE_W + DRAM_W
    assert result.energy_j == pytest.approx(watts * result.latency_s, rel=TOLERANCE)


def test_tp_with_another_engine_is_one_line_exit_2(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    done = _ipw("measure", "--tp", "2", "--db", str(db))
    assert done.returncode == 2
    assert "--tp is for --engine torch" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not db.exists()
