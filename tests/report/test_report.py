"""`ipw report` over a real SQLite store of synthetic runs: files, frontiers, labels, offline.

The plots are checked for presence here; tests/report/test_report_browser.py renders them.
"""

import csv
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openjarvis.cli.ipw import app
from openjarvis.errors import UserError
from openjarvis.report.accounting import WindowFlags, accounting
from openjarvis.report.plot import hardware_colours
from openjarvis.report.plots import tokens_plot
from openjarvis.report.runs import figure, hardware_label, pareto_frontier
from openjarvis.store import HostRecord, RunRecord, open_store
from tests.synthetic import add_run, make_host

__all__: list[str] = []

H200 = make_host("h200-box", gpus=("NVIDIA H200 (GPU-aaaa)",))
LAPTOP = make_host("laptop")


def ipw(*args: str) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output, result.exception


def test_pareto_frontier_keeps_only_undominated_points() -> None:
    points = [(100.0, 0.5), (50.0, 0.3), (200.0, 0.4), (300.0, 0.9), (50.0, 0.2), (120.0, 0.5)]
    # (200, 0.4) is beaten by (100, 0.5); (50, 0.2) by (50, 0.3); (120, 0.5) ties (100, 0.5) on
    # accuracy with more energy.
    assert pareto_frontier(points) == [1, 0, 3]
    assert pareto_frontier([]) == []
    assert pareto_frontier([(1.0, 0.0)]) == [0]


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "ipw.db")


@pytest.fixture
def two_machines(db: str) -> dict[str, str]:
    """Three models on the H200 box (measured), two on the laptop (estimated), one interrupted."""
    with open_store(db) as store:
        return {
            "small": add_run(store, H200, "small", accuracy=0.3, joules_per_task=50.0, seed=1),
            "medium": add_run(
                store,
                H200,
                "medium",
                accuracy=0.6,
                joules_per_task=150.0,
                seed=2,
                trace_samples=5000,
            ),
            "wasteful": add_run(store, H200, "wasteful", accuracy=0.2, joules_per_task=400.0),
            "laptop": add_run(
                store, LAPTOP, "small", accuracy=0.3, joules_per_task=120.0, method="estimate"
            ),
            "interrupted": add_run(store, LAPTOP, "medium", tasks=3, state="interrupted"),
        }


def test_frontiers_only_within_a_section_and_only_from_two_points(db: str, two_machines) -> None:
    """The measured H200 runs make a frontier (wasteful is dominated); the laptop's estimate is
    alone in its section, so it has none, and is never ranked against measurements."""
    out = Path(db).parent / "report"
    code, _, error = ipw("report", "--db", db, "--out", str(out))
    assert code == 0, error
    document = json.loads((out / "report.json").read_text())
    assert document["pareto_frontiers"] == {
        "humaneval · system scope · measured energy · n = 20": [
            two_machines["small"],
            two_machines["medium"],
        ]
    }
    estimated = next(s for s in document["sections"] if not s["measured"])
    assert [run["run_id"] for run in estimated["runs"]] == [two_machines["laptop"]]
    assert estimated["pareto_frontier"] == []


def test_report_writes_html_markdown_csv_and_json(db: str, two_machines, tmp_path: Path) -> None:
    out = tmp_path / "report"
    code, _, error = ipw("report", "--db", db, "--out", str(out))
    assert code == 0, error
    html = (out / "report.html").read_text()
    plots = re.findall(r'<figure class="plot" data-plot="([a-z-]+)"><svg', html)
    assert plots == ["accuracy-vs-energy", "joules", "accuracy-per-joule", "tokens", "power-traces"]
    # Offline: a policy that forbids every load, and nothing that would need one.
    assert "default-src 'none'" in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert "<script" not in html
    assert "(estimate)" in html and "est.</td>" in html

    document = json.loads((out / "report.json").read_text())
    assert {run["id"] for run in document["runs"]} == set(two_machines.values())
    assert document["pareto_frontiers"]["humaneval · system scope · measured energy · n = 20"] == [
        two_machines["small"],
        two_machines["medium"],
    ]
    with (out / "runs.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 5
    interrupted = next(row for row in rows if row["run_id"] == two_machines["interrupted"])
    assert interrupted["accuracy"] == "" and interrupted["state"] == "interrupted"
    markdown = (out / "report.md").read_text()
    assert "1 run(s) have no figures" in markdown
    runs_table = markdown.split("## Runs\n", 1)[1]
    laptop_row = next(
        line
        for line in runs_table.splitlines()
        if line.startswith(f"| {two_machines['laptop'][:8]}")
    )
    # Every energy figure of the estimated run is marked: all but accuracy of the 8 figures.
    assert laptop_row.count("est.") == 7


def test_local_versus_cloud_panel_only_with_cloud_runs(db: str, tmp_path: Path) -> None:
    with open_store(db) as store:
        add_run(store, H200, "small", tasks=10)
    assert ipw("report", "--db", db, "--out", str(tmp_path / "a"))[0] == 0
    assert 'data-plot="local-vs-cloud"' not in (tmp_path / "a" / "report.html").read_text()
    with open_store(db) as store:
        add_run(store, None, "gpt-4o", engine="cloud", method="estimate", tasks=10)
    assert ipw("report", "--db", db, "--out", str(tmp_path / "b"))[0] == 0
    html = (tmp_path / "b" / "report.html").read_text()
    assert 'data-plot="local-vs-cloud"' in html
    assert "Constants of the cloud estimates" in html and "joules_per_token" in html


def test_report_traces_and_errors(db: str, two_machines, tmp_path: Path) -> None:
    code, _, error = ipw(
        "report", "--db", db, "--out", str(tmp_path / "r"), "--trace", two_machines["small"]
    )
    assert isinstance(error, UserError) and "no power trace" in str(error)
    code, _, error = ipw("report", "--db", db, "--out", str(tmp_path / "r"), "--model", "nope")
    assert isinstance(error, UserError) and "no finished runs match" in str(error)
    code, _, error = ipw(
        "report",
        "--db",
        db,
        "--out",
        str(tmp_path / "r"),
        "--trace",
        two_machines["medium"][:8],
        "--host",
        "h200-box",
    )
    assert code == 0, error
    html = (tmp_path / "r" / "report.html").read_text()
    assert two_machines["medium"][:8] in html and "laptop" not in html


def test_host_labels_tell_machines_apart_by_hardware() -> None:
    """Virtual machines are often all called `vm`: the label adds what each computes with."""
    from dataclasses import replace

    from openjarvis.report.runs import host_label

    def run_on(host: HostRecord | None) -> RunRecord:
        return RunRecord(
            model_name="m", model_path=None, model_sha256=None, engine="llamacpp",
            engine_settings={}, suite="humaneval", options={}, energy_scope="system",
            energy_method="counter", sandbox_isolation="bubblewrap", tool_version="0",
            host=host,
        )  # fmt: skip

    two_gpus = make_host("vm", gpus=("NVIDIA H200 (GPU-aaaa)", "NVIDIA H200 (GPU-bbbb)"))
    assert host_label(run_on(two_gpus)) == "vm · 2 x NVIDIA H200"
    assert host_label(run_on(make_host("vm"))) == "vm · AMD EPYC 7B13, 2 cores"
    intel = replace(make_host("vm"), cpu_model="Intel(R) Xeon(R) CPU @ 2.20GHz")
    assert host_label(run_on(intel)) == "vm · Intel Xeon, 2 cores"
    # Runs stored before GPU names were kept list NVML source names only.
    legacy = make_host("vm", gpus=("nvml:GPU-aaaa",))
    assert host_label(run_on(legacy)) == "vm · 1 GPU"
    assert host_label(run_on(None)) == "unknown host"


def test_a_run_without_energy_figures_is_listed_and_said_not_drawn(
    db: str, two_machines, tmp_path: Path
) -> None:
    """A complete run whose energy is unknown for some task has accuracy but no energy figures:
    the report names it instead of dropping it from the energy plots silently."""
    with open_store(db) as store:
        run = store.get_run(two_machines["wasteful"])
        assert run is not None and run.summary is not None
        unknown = {"value": None, "low": None, "high": None, "null_reason": "energy-unknown"}
        summary = {**run.summary, "mean_energy_j": unknown, "accuracy_per_joule": unknown}
        store.finish_run(two_machines["wasteful"], "complete", summary)
    out = tmp_path / "report"
    code, _, error = ipw("report", "--db", db, "--out", str(out))
    assert code == 0, error
    markdown = (out / "report.md").read_text()
    assert f"1 run(s) without energy figures ({two_machines['wasteful'][:8]}" in markdown
    document = json.loads((out / "report.json").read_text())
    frontier_ids = {i for members in document["pareto_frontiers"].values() for i in members}
    assert two_machines["wasteful"] not in frontier_ids


def test_an_unknown_decode_rate_is_no_point_and_is_named(db: str, two_machines) -> None:
    with open_store(db) as store:
        runs = [store.get_run(two_machines[name]) for name in ("small", "medium")]
    assert runs[0] is not None and runs[1] is not None and runs[0].summary is not None
    assert figure(runs[0], "decode_tokens_per_s")[0] is not None
    colours = hardware_colours(hardware_label(run) for run in runs)
    both = tokens_plot(runs, colours)
    assert "not drawn" not in both.caption
    unknown = {"value": None, "low": None, "high": None, "null_reason": "too-few-tokens"}
    runs[0] = replace(runs[0], summary={**runs[0].summary, "decode_tokens_per_s": unknown})
    one = tokens_plot(runs, colours)
    assert one.caption.endswith("(not drawn): small Q4_K_M · H200 · llamacpp.")
    # One point fewer: a run at a rate of 0 would still be drawn as a marker.
    assert one.svg.count('<g id="line2d_') < both.svg.count('<g id="line2d_')


def test_plots_drawn_in_this_process_equal_those_of_the_forked_workers(
    db: str, two_machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One core: no workers, the plots are drawn here; the SVG must be the same bytes."""

    def figures(out: Path) -> list[str]:
        code, _, error = ipw("report", "--db", db, "--out", str(out))
        assert code == 0, error
        return re.findall(r"<figure.*?</figure>", (out / "report.html").read_text(), re.S)

    forked = figures(tmp_path / "forked")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr("openjarvis.report.write.ProcessPoolExecutor", None)  # no pool now
    here = figures(tmp_path / "here")
    assert len(forked) == 5 and forked == here


ACCOUNTING_COLUMNS = (
    "prefill_j_per_prompt_token",
    "decode_j_per_output_token",
    "tail_share_of_net_energy",
    "windows_low_resolution",
    "windows_overlapped",
    "windows_large_tail",
    "conservation_ratio",
    "idle_drift_w",
)


def _markdown_rows(markdown: str, section: str) -> dict[str, list[str]]:
    """The rows of a Markdown section's table, as cells, by their first cell (the run id)."""
    table = markdown.split(f"## {section}\n", 1)[1].strip("\n").split("\n\n", 1)[0]
    rows = [line.strip("|").split(" | ") for line in table.splitlines()[2:]]
    return {cells[0].strip(): [cell.strip() for cell in cells] for cells in rows}


def test_report_shows_the_meters_accounting_and_dashes_for_runs_from_before_it(
    db: str, tmp_path: Path
) -> None:
    """A run measured with window edges shows its prefill/decode split, tail share, flags,
    conservation and idle drift in every file; a run from before shows '—' and null, never 0."""
    with open_store(db) as store:
        new = add_run(store, H200, "new", scope="accelerator", windows=True, seed=3)
        old = add_run(store, H200, "old", seed=4)
        tasks = store.task_results(new)

    def total(values: list[float | None]) -> float:
        assert None not in values
        return sum(value for value in values if value is not None)

    prefill = total([t.prefill_energy_j for t in tasks]) / sum(t.prompt_tokens for t in tasks)
    decode = total([t.decode_energy_j for t in tasks]) / sum(t.completion_tokens for t in tasks)
    tail_share = total([t.tail_energy_j for t in tasks]) / total([t.net_energy_j for t in tasks])
    out = tmp_path / "report"
    code, _, error = ipw("report", "--db", db, "--out", str(out))
    assert code == 0, error

    markdown = (out / "report.md").read_text()
    rows = _markdown_rows(markdown, "Energy accounting")
    # tests/synthetic.py: tasks 0 and 10 short, 4, 9, 14 and 19 overlapped, 3, 10 and 17 with
    # half their net energy in the tail; idle +1.5 W on gpu:0 (the CPU package out of scope
    # drifted +8 W and is left out); conservation 0.996.
    assert rows[new[:8]][2:] == [
        f"{prefill:.3g}",
        f"{decode:.3g}",
        f"{100 * tail_share:.3g} %",
        "2 short · 4 overlapped · 3 large tail",
        "0.996",
        "+1.5",
    ]
    assert rows[old[:8]][2:] == ["—"] * 6
    assert "docs/energy.md" in markdown

    with (out / "runs.csv").open() as handle:
        csv_rows = {row["run_id"]: row for row in csv.DictReader(handle)}
    new_row, old_row = csv_rows[new], csv_rows[old]
    assert float(new_row["prefill_j_per_prompt_token"]) == pytest.approx(prefill)
    assert float(new_row["decode_j_per_output_token"]) == pytest.approx(decode)
    assert float(new_row["tail_share_of_net_energy"]) == pytest.approx(tail_share)
    assert [new_row[f"windows_{flag}"] for flag in ("low_resolution", "overlapped")] == ["2", "4"]
    assert new_row["windows_large_tail"] == "3"
    assert float(new_row["conservation_ratio"]) == pytest.approx(0.996)
    assert float(new_row["idle_drift_w"]) == pytest.approx(1.5)
    assert all(old_row[key] == "" for key in ACCOUNTING_COLUMNS)

    document = json.loads((out / "report.json").read_text())
    by_id = {run["id"]: run["energy_accounting"] for run in document["runs"]}
    assert by_id[new]["windows_overlapped"] == 4 and by_id[new]["idle_drift_w"] == 1.5
    assert by_id[new]["tail_share_of_net_energy"] == pytest.approx(tail_share)
    assert set(by_id[old]) == set(ACCOUNTING_COLUMNS)
    assert all(value is None for value in by_id[old].values())

    html = (out / "report.html").read_text()
    assert '<h3 id="energy-accounting">Energy accounting</h3>' in html
    assert "<td>2 short · 4 overlapped · 3 large tail</td>" in html
    assert "docs/energy.md explains how each is measured" in html


def test_accounting_counts_from_the_tasks_and_falls_back_to_the_summary(db: str) -> None:
    """Given task records, the report counts from them, not from what the summary says; without
    them it takes the summary's counts and split, and the tail share, which only tasks give, is
    unknown."""
    with open_store(db) as store:
        run_id = add_run(store, H200, "new", scope="accelerator", windows=True)
        run = store.get_run(run_id)
        tasks = store.task_results(run_id)
    assert run.summary is not None
    from_tasks = accounting(run, tasks)
    from_summary = accounting(run, [])
    assert from_tasks.window_flags == from_summary.window_flags == WindowFlags(20, 2, 4, 3)
    assert from_summary.prefill_j_per_prompt_token == from_tasks.prefill_j_per_prompt_token
    assert from_tasks.tail_share_of_net_energy is not None
    assert from_summary.tail_share_of_net_energy == pytest.approx(
        from_tasks.tail_share_of_net_energy
    )

    wrong = {"tasks": 20, "low_resolution": 0, "overlapped": 0, "large_tail": 0}
    run.summary = {**run.summary, "windows": wrong}
    assert accounting(run, tasks).window_flags == WindowFlags(20, 2, 4, 3)
    # An older run's tasks read as never overlapping: not known, so no counts at all.
    old_summary = {key: value for key, value in run.summary.items() if key != "windows"}
    old_tasks = [
        replace(
            t, tail_energy_j=None, prefill_energy_j=None, decode_energy_j=None, overlapped=False
        )
        for t in tasks
    ]
    run.summary = old_summary
    assert accounting(run, old_tasks).window_flags is None


def test_a_run_on_a_busy_machine_is_noted_and_its_verdict_not_resolved(
    db: str, two_machines, tmp_path: Path
) -> None:
    """The small model leads the H200 section; measured on a busy machine, the report says so
    with the evidence and no verdict involving it is resolved."""
    evidence = "other processes kept 0.98 cores busy during the tasks (29.4 CPU-s over 30.0 s)"
    busy = two_machines["small"]
    with open_store(db) as store:
        run = store.get_run(busy)
        assert run.summary is not None
        machine = {"busy": True, "evidence": [evidence], "stretches": []}
        store.finish_run(busy, "complete", {**run.summary, "machine": machine})
    out = tmp_path / "report"
    code, _, error = ipw("report", "--db", db, "--out", str(out))
    assert code == 0, error
    markdown = " ".join((out / "report.md").read_text().split())
    assert f"Run {busy[:8]} (" in markdown
    assert f"was measured on a busy machine (busy-machine: {evidence})" in markdown
    verdicts = json.loads((out / "report.json").read_text())["verdict"]
    involving = [v for v in verdicts if busy in (v["best"], v["other"])]
    assert involving and all(v["busy_machine"] and not v["resolved"] for v in involving)
    assert all("measured on a busy machine" in v["sentence"] for v in involving)
