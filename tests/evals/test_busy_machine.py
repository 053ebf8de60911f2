"""`ipw measure` on a machine that is not quiet: a run made while another process burns a core
is marked busy-machine, with the evidence in its summary, its note and `ipw show`. Faked at the
edges only: the batching engine and NVML of tests/evals/test_concurrent_measure.py."""

from pathlib import Path

from typer.testing import CliRunner

from openjarvis.cli.ipw import app
from openjarvis.store import open_store
from tests.evals.test_concurrent_measure import BatchingEngine, engine, measure
from tests.power.test_quiet import burner

__all__ = ["burner", "engine"]  # fixtures, used by name


def test_a_run_made_while_another_process_burns_a_core_is_marked_busy(
    engine: BatchingEngine, burner: int, tmp_path: Path
) -> None:
    result = measure(tmp_path, limit=3, concurrency=1)
    assert result.energy_note is not None
    assert "busy-machine: other processes kept" in result.energy_note
    with open_store(str(tmp_path / "runs.db")) as store:
        run = store.get_run(result.run_id)
    assert run.summary is not None
    machine = run.summary["machine"]
    assert isinstance(machine, dict) and machine["busy"] is True
    stretches = {stretch["stretch"]: stretch for stretch in machine["stretches"]}
    assert set(stretches) == {"idle", "tasks"}
    # The burner ran through both; each stretch saw at least a quarter core of others' work.
    for stretch in stretches.values():
        assert stretch["other_cpu_s"] >= 0.25 * stretch["seconds"]
    shown = CliRunner().invoke(
        app, ["show", result.run_id, "--db", str(tmp_path / "runs.db")], env={"COLUMNS": "300"}
    )
    assert shown.exit_code == 0, shown.exception
    assert "busy-machine: other processes kept" in shown.output
