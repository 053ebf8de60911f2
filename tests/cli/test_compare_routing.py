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
    oracle, by_cost, best, cloud = found["routes"]
    assert by_cost["name"] == "oracle by API cost" and by_cost["energy_j"] == 57.5
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


def test_compare_gives_a_verdict_on_the_tasks_both_ran(tmp_path: Path) -> None:
    """small (1/4 at 10 J: 25 passes per kJ) against the cloud run (3/4 of the same four tasks
    at 100 J: 7.5; its two extra tasks are left out): small leads by 25 / 7.5, and the verdict
    says the two are not like for like (a measured run against an estimate)."""
    db = str(tmp_path / "ipw.db")
    ids = []
    with open_store(db) as store:
        for record, extra in ((RUNS[0], 0), (RUNS[2], 2)):
            run_id = store.create_run(replace(record, state="running", id=None))
            for task in tasks_of(record.id or "", extra):
                store.save_task_result(run_id, task)
            store.finish_run(run_id, "complete", {})
            ids.append(run_id)
    runner = CliRunner()
    args = ["compare", ids[1], ids[0], "--db", db]
    result = runner.invoke(app, [*args, "--json"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.exception
    (found,) = json.loads(result.output)["verdicts"]
    assert (found["best"], found["other"], found["tasks"]) == (ids[0], ids[1], 4)
    assert found["ratio"]["value"] == pytest.approx(25 / 7.5)
    assert (found["passed"], found["samples"]) == ([1, 3], [4, 4])
    assert not found["like_for_like"]
    assert any("energy is an estimate" in limit for limit in found["limits"])
    # At the cloud band's bottom (x0.5) small still leads: 25 / (7.5 / 0.5) = 1.67.
    assert found["limits"][-1] == (
        "the lead holds at the edge of the estimates' stated bands (still 1.7x)"
    )
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.exception
    assert "not like for like: small-1b · unknown hardware · llamacpp does 3.3x [" in (
        result.output.replace("\n", " ")
    )
