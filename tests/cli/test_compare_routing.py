"""`ipw compare` prints coverage and routing over the runs' shared tasks, and gives the same
figures as JSON: checked against the four hand-made tasks of tests/report/test_routing.py."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openjarvis.cli.ipw import app
from openjarvis.store import open_store
from tests.report.test_routing import RUNS, tasks_of

__all__: list[str] = []


def test_compare_shows_coverage_oracle_and_router(tmp_path: Path) -> None:
    db = str(tmp_path / "ipw.db")
    ids = []
    with open_store(db) as store:
        for record in RUNS:
            run_id = store.create_run(replace(record, state="running", id=None))
            for task in tasks_of(record.id or ""):
                store.save_task_result(run_id, task)
            store.finish_run(run_id, "complete", {})
            ids.append(run_id)
    runner = CliRunner()
    args = ["compare", *ids, "--db", db, "--allow-mixed-scope"]
    result = runner.invoke(app, [*args, "--json"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.exception
    found = json.loads(result.output)["routing"]
    # The cloud run is taken first (without it there is no router), then the runs as given.
    assert found["tasks"] == 4 and found["runs"] == [ids[2], ids[0], ids[1]]
    assert (found["coverage"], found["local_coverage"]) == (0.75, 0.5)
    oracle, best, cloud = found["routes"]
    assert (oracle["accuracy"], oracle["energy_j"], oracle["cost_usd"]) == (0.75, 57.5, None)
    assert (best["accuracy"], best["energy_j"]) == (0.75, 100.0)
    assert cloud["name"] == "cloud: unpriced-model · cloud · openai"
    assert [point["p"] for point in found["router"]] == [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    for point in found["router"]:
        assert point["accuracy"] == pytest.approx((2 + point["p"]) / 4)
        assert point["energy_j"] == pytest.approx((240 - 10 * point["p"]) / 4)

    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.exception
    assert "coverage and routing over 4 shared tasks: 75% solved by at least one run, 50% by a" in (
        result.output
    )
    assert "│ oracle over all runs" in result.output and "57.5 (incl. est.)" in result.output
    assert "│ p = 0.5 │    62.5% │" in result.output
