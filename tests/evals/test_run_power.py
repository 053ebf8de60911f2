"""Mean power under concurrency is the machine's, not a task's share: `ipw measure` and `ipw
show` give the union of the windows' energy over their time. Faked at the edges only: the
batching engine and NVML of tests/evals/test_concurrent_measure.py (a board drawing 100 W idle
and 50 W per sequence in a step)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openjarvis.cli.ipw import app
from openjarvis.store import open_store
from tests.evals.test_concurrent_measure import IDLE_W, BatchingEngine, engine, measure

__all__ = ["engine"]  # a fixture, used by name


def test_mean_power_at_concurrency_is_the_machines_over_the_union(
    engine: BatchingEngine, tmp_path: Path
) -> None:
    result = measure(tmp_path)  # 8 tasks, 4 in flight
    union = result.concurrency
    assert isinstance(union["union_energy_j"], float)
    assert isinstance(union["union_seconds"], float)
    machine_w = union["union_energy_j"] / union["union_seconds"]
    # The board never draws less than idle while it works; a task's share over its own time
    # (about a quarter of the machine's power here) would.
    assert machine_w > IDLE_W
    figures = result.figures
    assert figures.mean_power_w.value == pytest.approx(machine_w)
    assert figures.accuracy.value is not None
    assert figures.accuracy_per_watt.value == pytest.approx(figures.accuracy.value / machine_w)
    with open_store(str(tmp_path / "runs.db")) as store:
        summary = store.get_run(result.run_id).summary
    assert summary is not None
    mean_power_w = summary["mean_power_w"]
    assert isinstance(mean_power_w, dict)
    assert mean_power_w["value"] == pytest.approx(machine_w)
    shown = CliRunner().invoke(
        app, ["show", result.run_id, "--db", str(tmp_path / "runs.db"), "--json"]
    )
    assert shown.exit_code == 0, shown.exception
    assert json.loads(shown.output)["figures"]["mean_power_w"]["value"] == pytest.approx(machine_w)
