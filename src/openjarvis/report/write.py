"""`ipw report`'s files: report.html with the plots, and the same runs as Markdown, CSV and JSON.

Takes plain records from the store; the figures are those `ipw measure` stored with each run.
"""

import csv
import json
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path

from openjarvis.report.drawing import Plot
from openjarvis.report.html import render_html
from openjarvis.report.plots import (
    accuracy_per_joule_plot,
    accuracy_vs_energy_plot,
    local_vs_cloud_plot,
    power_traces_plot,
    tokens_plot,
)
from openjarvis.report.runs import (
    FIGURE_COLUMNS,
    figure,
    format_interval,
    frontiers,
    host_label,
    is_cloud,
    is_estimate,
    mark_estimate,
    model_label,
    newest_per_group,
    run_row,
    run_to_dict,
)
from openjarvis.store import PowerSampleRecord, RunRecord

__all__ = ["ReportData", "ReportFiles", "write_report"]

TITLE = "OpenJarvis report"


@dataclass(frozen=True, slots=True)
class ReportData:
    runs: Sequence[RunRecord]  # newest first; runs without figures are listed, not plotted
    traces: Sequence[tuple[RunRecord, Sequence[PowerSampleRecord]]]  # runs whose power is drawn
    database: str
    generated_at: datetime


@dataclass(frozen=True, slots=True)
class ReportFiles:
    html: Path
    markdown: Path
    csv: Path
    json: Path


def _plotted(data: ReportData) -> list[RunRecord]:
    return [run for run in data.runs if run.summary is not None]


def _meta(data: ReportData) -> str:
    hosts = {host_label(run) for run in data.runs}
    when = data.generated_at.isoformat(timespec="seconds")
    return f"{len(data.runs)} runs from {len(hosts)} host(s) · {data.database} · generated {when}"


def _notes(data: ReportData) -> list[str]:
    notes = []
    unplotted = len(data.runs) - len(_plotted(data))
    if unplotted:
        notes.append(f"{unplotted} run(s) have no figures (not complete): listed, not plotted.")
    no_energy = [run for run in _plotted(data) if figure(run, "mean_energy_j")[0] is None]
    if no_energy:
        ids = ", ".join((run.id or "")[:8] for run in no_energy)
        notes.append(
            f"{len(no_energy)} run(s) without energy figures ({ids}: energy unknown for some "
            "of their tasks, see `ipw show`): listed, not drawn where energy is."
        )
    if any(is_estimate(run) for run in data.runs):
        notes.append(
            "Energy marked 'est.', hollow markers and hatched bars is estimated from a model "
            "(CPU utilisation and TDP, or a cloud's published joules per token), not measured."
        )
    scopes = sorted({run.energy_scope for run in data.runs})
    if len(scopes) > 1:
        notes.append(
            f"Runs use different energy scopes ({', '.join(scopes)}): compare energy within one "
            "scope only; each scope has its own Pareto frontier."
        )
    return notes


def build_plots(data: ReportData) -> list[Plot]:
    runs = _plotted(data)
    groups = newest_per_group(runs)
    tasks: list[Callable[[], Plot]] = [
        partial(accuracy_vs_energy_plot, runs),
        partial(accuracy_per_joule_plot, groups),
        partial(tokens_plot, groups),
    ]
    if data.traces:
        tasks.append(partial(power_traces_plot, data.traces))
    if any(is_cloud(run) for run in groups):
        tasks.append(partial(local_vs_cloud_plot, groups))
    return _render(tasks)


# The plots being rendered, for forked workers: they inherit this list and return SVG text.
_TASKS: list[Callable[[], Plot]] = []


def _render_one(index: int) -> Plot:
    return _TASKS[index]()


def _render(tasks: list[Callable[[], Plot]]) -> list[Plot]:
    """Each plot in its own forked process where there are cores to spare: drawing is pure
    Python in matplotlib (1.6 s of a 3-s report over 200 runs on one core, measured)."""
    workers = min(
        len(tasks), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    )
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return [task() for task in tasks]
    _TASKS[:] = tasks
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            return list(pool.map(_render_one, range(len(tasks))))
    finally:
        _TASKS.clear()


def _markdown(data: ReportData, plots: Sequence[Plot]) -> str:
    lines = [f"# {TITLE}", "", _meta(data), ""]
    lines += [f"- {note}" for note in _notes(data)]
    lines += ["", "## Pareto frontiers (accuracy versus J per task)", ""]
    for group, members in frontiers(_plotted(data)).items():
        labels = ", ".join(
            f"{model_label(r)} on {host_label(r)} ({(r.id or '')[:8]})" for r in members
        )
        lines.append(f"- {group}: {labels}")
    lines += ["", "## Plots (in report.html)", ""]
    lines += [f"- **{plot.title}**: {plot.caption}" for plot in plots]
    headings = ["run", "model", "host", "suite", "state", "energy"]
    headings += [FIGURE_COLUMNS[name] for name in FIGURE_COLUMNS]
    lines += ["", "## Runs", "", "| " + " | ".join(headings) + " |"]
    lines.append("|" + " --- |" * len(headings))
    for run in data.runs:
        cells = [
            (run.id or "")[:8],
            model_label(run),
            host_label(run),
            run.suite,
            run.state,
            f"{run.energy_method or 'none'} · {run.energy_scope}",
        ]
        for name in FIGURE_COLUMNS:
            text = format_interval(*figure(run, name))
            cells.append(text if name == "accuracy" else mark_estimate(text, run))
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def _json(data: ReportData) -> str:
    document = {
        "title": TITLE,
        "generated_at": data.generated_at.isoformat(),
        "database": data.database,
        "notes": _notes(data),
        "pareto_frontiers": {
            group: [run.id for run in members]
            for group, members in frontiers(_plotted(data)).items()
        },
        "runs": [run_to_dict(run) for run in data.runs],
    }
    return json.dumps(document, indent=2) + "\n"


def write_report(data: ReportData, out_dir: Path) -> ReportFiles:
    """Write report.html, report.md, runs.csv and report.json into out_dir (created if needed)."""
    if not _plotted(data):
        raise ValueError("a report needs at least one run with figures")
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = build_plots(data)
    cloud_runs = [run for run in data.runs if is_cloud(run)]
    files = ReportFiles(
        out_dir / "report.html",
        out_dir / "report.md",
        out_dir / "runs.csv",
        out_dir / "report.json",
    )
    files.html.write_text(
        render_html(TITLE, _meta(data), plots, data.runs, cloud_runs, _notes(data)),
        encoding="utf-8",
    )
    files.markdown.write_text(_markdown(data, plots), encoding="utf-8")
    rows = [run_row(run) for run in data.runs]
    with files.csv.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    files.json.write_text(_json(data), encoding="utf-8")
    return files
