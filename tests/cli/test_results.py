"""`ipw runs`, `ipw show` and `ipw compare` over a real SQLite store filled with synthetic runs.

Commands run through Typer's test runner; UserErrors surface as the exception `main()` prints.
"""

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openjarvis.cli.ipw import app
from openjarvis.errors import UserError
from openjarvis.store import Store, open_store
from tests.synthetic import add_run, make_host

__all__: list[str] = []

H200 = make_host("h200-box", gpus=("NVIDIA H200 (GPU-aaaa)",))
LAPTOP = make_host("laptop")


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "ipw.db")


@pytest.fixture
def store(db: str):
    with open_store(db) as opened:
        yield opened


def ipw(*args: str) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "240"})
    return result.exit_code, result.output, result.exception


def test_runs_lists_newest_first_and_filters(store: Store, db: str) -> None:
    first = add_run(store, H200, "gemma", tasks=5)
    second = add_run(store, LAPTOP, "gemma", tasks=5, method="estimate", seed=1)
    third = add_run(store, LAPTOP, "qwen", suite="mmlu", tasks=5, seed=2)

    def listed(*options: str) -> list[str]:
        code, output, error = ipw("runs", "--db", db, "--json", *options)
        assert code == 0, error
        return [row["run_id"] for row in json.loads(output)]

    assert listed() == [third, second, first]
    assert listed("--model", "gemma") == [second, first]
    assert listed("--host", "h200-box") == [first]
    assert listed("--host", LAPTOP.fingerprint[:6]) == [third, second]
    assert listed("--suite", "mmlu") == [third]
    assert listed("--limit", "1") == [third]
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    assert listed("--since", tomorrow) == []
    assert listed("--since", "2000-01-01") == [third, second, first]

    code, output, _ = ipw("runs", "--db", db)
    assert code == 0
    assert first[:8] in output and "h200-box" in output
    # The estimated run's energy figures are marked, the measured ones are not.
    estimated_line = next(line for line in output.splitlines() if second[:8] in line)
    measured_line = next(line for line in output.splitlines() if first[:8] in line)
    assert "est." in estimated_line and "est." not in measured_line


def test_runs_rejects_a_bad_date(db: str) -> None:
    _, _, error = ipw("runs", "--db", db, "--since", "last tuesday")
    assert isinstance(error, UserError) and "--since takes a date" in str(error)


def test_runs_on_an_empty_database(db: str) -> None:
    open_store(db).close()
    code, output, _ = ipw("runs", "--db", db)
    assert code == 0 and "no runs match" in output


def test_show_prints_metadata_figures_and_tasks(store: Store, db: str) -> None:
    run_id = add_run(store, H200, "gemma", tasks=12, accuracy=0.5)
    code, output, error = ipw("show", run_id[:10], "--db", db)
    assert code == 0, error
    for text in (
        run_id,
        "h200-box",
        "NVIDIA H200",
        "accuracy per J",
        "HumanEval/11",
        "J per solved task",
    ):
        assert text in output
    code, output, _ = ipw("show", run_id, "--db", db, "--json")
    data = json.loads(output)
    assert data["run"]["id"] == run_id and len(data["tasks"]) == 12
    # The figures shown are the ones `ipw measure` stored: same computation, same seed.
    assert data["figures"] == store.get_run(run_id).summary
    apj = data["figures"]["accuracy_per_joule"]
    assert apj["low"] < apj["value"] < apj["high"]


def test_show_states_the_model_kind_and_the_prompting(store: Store, db: str) -> None:
    evidence = "no tokenizer.chat_template, and no instruction tuning named (general.name 'g')"
    run_id = add_run(
        store,
        H200,
        "gemma",
        tasks=2,
        options={"prompting": {"code": "completion"}},
        model_kind=("base", evidence),
    )
    older = add_run(store, H200, "qwen", tasks=2)  # stored before either was recorded
    mixed = add_run(
        store,
        H200,
        "qwen-it",
        tasks=2,
        options={"prompting": {"code": "completion", "multiple_choice": "chat-template"}},
        model_kind=("chat", "tokenizer.chat_template present"),
    )

    def rows(run: str) -> dict[str, str]:
        code, output, error = ipw("show", run, "--db", db)
        assert code == 0, error
        cells = (line.strip("│ ").split("│") for line in output.splitlines() if "│" in line)
        return {c[0].strip(): c[1].strip() for c in cells if len(c) == 2}

    assert rows(run_id)["model kind"] == f"base ({evidence})"
    assert rows(run_id)["prompting"] == "completion"
    assert rows(older)["model kind"] == "unknown (a cloud model, or the run predates reading it)"
    assert rows(older)["prompting"].startswith("completion (not recorded")
    assert rows(mixed)["prompting"] == "completion (code), chat-template (multiple_choice)"
    _, output, _ = ipw("show", run_id, "--db", db, "--json")
    run = json.loads(output)["run"]
    assert run["model_kind"] == "base" and run["options"]["prompting"] == {"code": "completion"}


def test_show_labels_partial_figures_of_an_interrupted_run(store: Store, db: str) -> None:
    run_id = add_run(store, H200, tasks=4, state="interrupted")
    code, output, _ = ipw("show", run_id, "--db", db)
    assert code == 0 and "interrupted: figures are partial" in output


def test_show_unknown_run_is_a_user_error(store: Store, db: str) -> None:
    _, _, error = ipw("show", "ffff", "--db", db)
    assert isinstance(error, UserError) and "no run with id" in str(error)


def test_compare_refuses_mixed_scopes_unless_allowed(store: Store, db: str) -> None:
    system = add_run(store, H200, scope="system", tasks=8)
    accelerator = add_run(store, H200, scope="accelerator", tasks=8, seed=1)
    code, _, error = ipw("compare", system, accelerator, "--db", db)
    assert isinstance(error, UserError)
    assert "different energy scopes" in str(error) and "--allow-mixed-scope" in str(error)
    code, output, error = ipw("compare", system, accelerator, "--db", db, "--allow-mixed-scope")
    assert code == 0, error
    assert "energy scopes differ" in output


def test_compare_pairs_same_tasks_and_labels_estimates(store: Store, db: str) -> None:
    measured = add_run(store, H200, tasks=10, joules_per_task=50.0)
    estimated = add_run(store, LAPTOP, tasks=10, joules_per_task=200.0, method="estimate", seed=1)
    fewer = add_run(store, LAPTOP, tasks=6, seed=2)
    code, output, error = ipw("compare", measured, estimated, fewer, "--db", db, "--json")
    assert code == 0, error
    data = json.loads(output)
    assert [run["run_id"] for run in data["runs"]] == [measured, estimated, fewer]
    to_estimated, to_fewer = data["comparisons"]
    assert to_estimated["paired"] and to_estimated["energy_estimated"]
    assert not to_fewer["paired"] and not to_fewer["energy_estimated"]
    ratio = to_estimated["ratios"]["mean_energy_j"]
    assert ratio["low"] < ratio["value"] < ratio["high"]
    # The ratio is of the two runs' own figures.
    energies = [run["figures"]["mean_energy_j"]["value"] for run in data["runs"][:2]]
    assert ratio["value"] == pytest.approx(energies[1] / energies[0])

    code, output, _ = ipw("compare", measured, estimated, "--db", db)
    assert "(estimate)" in output and "(vs estimate)" in output
    energy_line = next(line for line in output.splitlines() if "J per task" in line)
    # Measured column unmarked; the estimated run's value and the ratio to it are marked.
    assert energy_line.count("est.") == 2
    assert "paired over 10 shared tasks" in output


def test_compare_needs_two_runs(store: Store, db: str) -> None:
    run_id = add_run(store, H200, tasks=3)
    _, _, error = ipw("compare", run_id, "--db", db)
    assert isinstance(error, UserError) and "at least two" in str(error)


def test_db_export_then_merge_twice_leaves_one_copy(store: Store, db: str, tmp_path: Path) -> None:
    run_id = add_run(store, LAPTOP, tasks=4, trace_samples=100)
    exported = tmp_path / "laptop-export.db"
    code, output, error = ipw("db", "export", str(exported), "--db", db)
    assert code == 0, error
    assert "1 run(s)" in output
    _, _, error = ipw("db", "export", str(exported), "--db", db)
    assert isinstance(error, UserError) and "already exists" in str(error)

    team = str(tmp_path / "team.db")
    code, output, error = ipw("db", "merge", str(exported), "--db", team)
    assert code == 0, error
    assert "1 run(s) added" in output
    code, output, _ = ipw("db", "merge", str(exported), str(exported), "--db", team)
    assert output.count("1 already present") == 2
    with open_store(team) as merged:
        assert [run.id for run in merged.list_runs()] == [run_id]
        assert len(merged.power_samples(run_id)) == 100


def test_db_merge_errors(db: str, tmp_path: Path) -> None:
    _, _, error = ipw("db", "merge", str(tmp_path / "missing.db"), "--db", db)
    assert isinstance(error, UserError) and "no database at" in str(error)
    open_store(db).close()
    _, _, error = ipw("db", "merge", db, "--db", db)
    assert isinstance(error, UserError) and "being merged into" in str(error)


def test_show_and_compare_give_one_run_the_same_intervals(store: Store, db: str) -> None:
    """One interval module: the same run's net J per task and accuracy read the same in `ipw
    show` and `ipw compare` (compare once left out the idle baseline's error)."""
    first = add_run(store, H200, "gemma", tasks=12, windows=True)
    second = add_run(store, H200, "qwen", tasks=12, windows=True, seed=3)
    code, shown, error = ipw("show", first, "--db", db, "--json")
    assert code == 0, error
    code, compared, error = ipw("compare", first, second, "--db", db, "--json")
    assert code == 0, error
    shown_figures = json.loads(shown)["figures"]
    compared_figures = json.loads(compared)["runs"][0]["figures"]
    for name in ("accuracy", "mean_net_energy_j", "accuracy_per_joule_net", "mean_power_w"):
        assert shown_figures[name] == compared_figures[name], name
    stored = store.get_run(first).summary or {}
    assert shown_figures["mean_net_energy_j"] == stored["mean_net_energy_j"]


def test_compare_across_suites_says_so_and_gives_no_verdict(store: Store, db: str) -> None:
    """Two runs alike but for their suite: the columns name each suite, a note says they
    differ, and no verdict weighs one suite's work against the other's."""
    humaneval = add_run(store, H200, "gemma", tasks=12)
    arithmetic = add_run(store, H200, "gemma", suite="arithmetic", tasks=12, seed=4)
    code, output, error = ipw("compare", humaneval, arithmetic, "--db", db)
    assert code == 0, error
    assert "the runs ran different suites" in output
    assert f"{humaneval[:8]}: humaneval, {arithmetic[:8]}: arithmetic" in output
    assert "passes per kJ of" not in output and "energy per task of" not in output
    code, output, error = ipw("compare", humaneval, arithmetic, "--db", db, "--json")
    data = json.loads(output)
    assert data["verdicts"] == [] and data["suites"][arithmetic] == "arithmetic"


def test_show_of_a_judged_run_names_the_judge_run_and_the_samples_it_could_not_score(
    store: Store, db: str
) -> None:
    judged = add_run(store, H200, "gemma", suite="open.jsonl", tasks=3)
    unscored = replace(store.task_results(judged)[0], task_id="q/9", passed=0, statuses=("error",))
    store.save_task_result(judged, unscored)
    judge = add_run(store, H200, "judge-model", suite=f"judge-of:{judged}", tasks=4, seed=7)
    code, output, error = ipw("show", judged, "--db", db)
    assert code == 0, error
    assert f"judged by run {judge[:8]} (`ipw show {judge[:8]}`)" in output
    assert "1 of 4 samples could not be scored" in output
    assert "count as not passed, so accuracy is a lower bound" in output
    code, output, error = ipw("show", judged, "--db", db, "--json")
    assert json.loads(output)["judge_run"] == judge


def test_show_has_one_j_per_output_token_row(store: Store, db: str) -> None:
    run_id = add_run(store, H200, "gemma", tasks=5, windows=True)
    code, output, error = ipw("show", run_id, "--db", db)
    assert code == 0, error
    rows = [line for line in output.splitlines() if "per output token" in line]
    assert len(rows) == 1 and "(decode alone " in rows[0]
