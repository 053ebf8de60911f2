"""`ipw report`'s files: report.html with the plots, and the same runs as Markdown, CSV and JSON.

Takes plain records from the store; the figures are those `ipw measure` stored with each run.
The plots are drawn by PlotWorkers: forked processes that import matplotlib (about a second)
while this one reads the database, so that this process never imports it.
"""

import csv
import importlib
import json
import multiprocessing
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from openjarvis.report.accounting import (
    ACCOUNTING_HEADINGS,
    ACCOUNTING_NOTE,
    Accounting,
    accounting,
    accounting_cells,
    accounting_row,
)
from openjarvis.report.analysis import Analysis, analyse, analysis_json
from openjarvis.report.analysis import panels as analysis_panels
from openjarvis.report.content import (
    Block,
    TextTable,
    configuration_block,
    gate_blocks,
    headline_block,
    joules_block,
    routing_blocks,
)
from openjarvis.report.html import render_html
from openjarvis.report.plot import Plot
from openjarvis.report.runs import (
    FIGURE_COLUMNS,
    busy_evidence,
    coverage_missing,
    energy_label,
    figure,
    host_label,
    is_cloud,
    is_estimate,
    is_partial,
    run_row,
    run_tasks_text,
    run_to_dict,
    short_label,
    suite_name,
)
from openjarvis.report.uncertainty import run_figure_text
from openjarvis.store import PowerSeries, RunRecord, TaskResultRecord

__all__ = ["PlotWorkers", "ReportData", "ReportFiles", "write_report"]

TITLE = "OpenJarvis report"
PLOTS_MODULE = "openjarvis.report.plots"  # imports matplotlib
MAX_PLOTS = 6


@dataclass(frozen=True, slots=True)
class ReportData:
    runs: Sequence[RunRecord]  # newest first; runs without figures are listed, not plotted
    traces: Sequence[tuple[RunRecord, Mapping[str, PowerSeries]]]  # runs whose power is drawn
    database: str
    generated_at: datetime
    # Each run's saved tasks by run id, for its energy accounting; a run without any here is
    # accounted from the summary `ipw measure` stored (no tail share then).
    tasks: Mapping[str, Sequence[TaskResultRecord]] = field(default_factory=dict)


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
    partial = [run for run in data.runs if is_partial(run)]
    if partial:
        listed = "; ".join(
            f"{(run.id or '')[:8]}: {', '.join(coverage_missing(run.energy_coverage))}"
            for run in partial
        )
        notes.append(
            f"{len(partial)} run(s) have a partial energy scope, marked '(partial)': a source in "
            f"scope could not be read, so their energy leaves it out ({listed})."
        )
    for run in data.runs:
        evidence = busy_evidence(run)
        if evidence:
            notes.append(
                f"Run {(run.id or '')[:8]} ({short_label(run)}) was measured on a busy machine "
                f"(busy-machine: {'; '.join(evidence)}): another program's draw is in its "
                "energy, so no verdict rests on it alone."
            )
    suites = sorted({suite_name(run) for run in data.runs})
    if len(suites) > 1:
        notes.append(
            f"Runs of {len(suites)} suites ({', '.join(suites)}): each suite has its own "
            "sections and verdict; no ratio or verdict is given across suites."
        )
    scopes = sorted({run.energy_scope for run in data.runs})
    if len(scopes) > 1:
        notes.append(
            f"Runs use different energy scopes ({', '.join(scopes)}): accelerator counts only the "
            "GPUs the engine ran on, system adds CPU packages and DRAM. Each scope is its own "
            "section with its own frontier; a ratio across them is labelled not like for like."
        )
    return notes


# A plot to draw: the name of a function in PLOTS_MODULE and its arguments (names rather than
# functions, so that choosing plots does not import matplotlib here).
PlotTask = tuple[str, tuple[object, ...]]


def plot_tasks(data: ReportData, analysis: Analysis) -> list[PlotTask]:
    groups, colours = analysis.groups, analysis.colours
    tasks: list[PlotTask] = []
    panels = analysis_panels(analysis.sections)
    if panels:
        tasks.append(("sections_plot", (panels, colours)))
    tasks.append(("joules_plot", (analysis.splits, colours)))
    if analysis.concurrency_series:
        tasks.append(("concurrency_plot", (analysis.concurrency_series, colours)))
    tasks.append(("accuracy_per_joule_plot", (groups, colours)))
    tasks.append(("tokens_plot", (groups, colours)))
    if data.traces:
        tasks.append(("power_traces_plot", (data.traces,)))
    if any(is_cloud(run) for run in groups):
        tasks.append(("local_vs_cloud_plot", (groups, colours)))
    return tasks


def _parts(analysis: Analysis, plots: Sequence[Plot]) -> list[Block | Plot]:
    """The page's parts in reading order: verdict, sections (with their scatter), the
    configurations, where the joules go (with its bars), routing, then the other plots."""
    by_name = {plot.name: plot for plot in plots}
    gate_parts = gate_blocks(analysis.sections)
    parts: list[Block | Plot] = [headline_block(analysis.headline), gate_parts[0]]
    if "accuracy-vs-energy" in by_name:
        parts.append(by_name.pop("accuracy-vs-energy"))
    parts += gate_parts[1:]
    parts.append(configuration_block(analysis.groups))
    parts.append(joules_block(analysis.splits))
    parts.append(by_name.pop("joules"))
    if "concurrency" in by_name:
        parts.append(by_name.pop("concurrency"))
    parts += routing_blocks(analysis.routings)
    parts += list(by_name.values())
    return parts


def _draw(task: PlotTask) -> Plot:
    name, arguments = task
    return getattr(importlib.import_module(PLOTS_MODULE), name)(*arguments)


def _import_plots() -> None:
    importlib.import_module(PLOTS_MODULE)


class PlotWorkers:
    """One forked process per core (at most one per plot), started on entering: each imports
    matplotlib at once, so that the import overlaps with whatever the caller does next (reading
    the database), then draws plots (pure Python in matplotlib: 1.6 s of a 3-s report over 200
    runs on one core, measured). With one core, or no fork, plots are drawn in this process."""

    def __init__(self) -> None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        self.count = min(cores, MAX_PLOTS)
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> "PlotWorkers":
        if self.count >= 2 and "fork" in multiprocessing.get_all_start_methods():
            context = multiprocessing.get_context("fork")
            self.pool = ProcessPoolExecutor(max_workers=self.count, mp_context=context)
            for _ in range(self.count):
                self.pool.submit(_import_plots)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def draw(self, tasks: Sequence[PlotTask]) -> list[Plot]:  # in the order of tasks
        if self.pool is None:
            return [_draw(task) for task in tasks]
        return list(self.pool.map(_draw, tasks))


def _accounts(data: ReportData) -> list[Accounting]:
    """Each run's energy accounting, in the order of data.runs."""
    return [accounting(run, data.tasks.get(run.id or "", ())) for run in data.runs]


def _markdown_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _markdown_table(table: TextTable) -> list[str]:
    return [
        _markdown_row(table.headings),
        "|" + " --- |" * len(table.headings),
        *(_markdown_row(row) for row in table.rows),
    ]


def _markdown_parts(parts: Sequence[Block | Plot]) -> list[str]:
    lines: list[str] = []
    for part in parts:
        if isinstance(part, Plot):
            lines += [f"**Plot in report.html, {part.title}**: {part.caption}", ""]
            continue
        lines += ["#" * part.level + f" {part.title}", ""]
        lines += [
            x for line in part.lines for x in (f"> {line.text}" if line.limit else line.text, "")
        ]
        for table in part.tables:
            lines += [*_markdown_table(table), ""]
    return lines


def _markdown(
    data: ReportData,
    parts: Sequence[Block | Plot],
    accounts: Sequence[Accounting],
    notes: Sequence[str],
) -> str:
    lines = [f"# {TITLE}", "", _meta(data), ""]
    lines += _markdown_parts(parts[:1])
    lines += [f"- {note}" for note in notes]
    lines += ["", *_markdown_parts(parts[1:])]
    headings = ["run", "model · hardware · engine", "host", "suite", "state", "energy", "tasks"]
    headings += [FIGURE_COLUMNS[name] for name in FIGURE_COLUMNS]
    lines += ["## Runs", "", "Each run on all its own tasks.", "", _markdown_row(headings)]
    lines.append("|" + " --- |" * len(headings))
    for run in data.runs:
        cells = [
            (run.id or "")[:8],
            short_label(run),
            host_label(run),
            run.suite,
            run.state,
            energy_label(run),
            run_tasks_text(run),
        ]
        for name in FIGURE_COLUMNS:
            cells.append(run_figure_text(run, name))
        lines.append(_markdown_row(cells))
    headings = ["run", "model · hardware · engine", *ACCOUNTING_HEADINGS]
    lines += ["", "## Energy accounting", "", _markdown_row(headings)]
    lines.append("|" + " --- |" * len(headings))
    for run, figures in zip(data.runs, accounts, strict=True):
        cells = [(run.id or "")[:8], short_label(run), *accounting_cells(run, figures)]
        lines.append(_markdown_row(cells))
    lines += ["", ACCOUNTING_NOTE]
    return "\n".join(lines) + "\n"


def _json(
    data: ReportData, analysis: Analysis, accounts: Sequence[Accounting], notes: Sequence[str]
) -> str:
    document = {
        "title": TITLE,
        "generated_at": data.generated_at.isoformat(),
        "database": data.database,
        "notes": list(notes),
        **analysis_json(analysis),
        "runs": [
            {**run_to_dict(run), "energy_accounting": accounting_row(figures)}
            for run, figures in zip(data.runs, accounts, strict=True)
        ],
    }
    return json.dumps(document, indent=2) + "\n"


def write_report(data: ReportData, out_dir: Path, workers: PlotWorkers) -> ReportFiles:
    """Write report.html, report.md, runs.csv and report.json into out_dir (created if needed)."""
    plotted = _plotted(data)
    if not plotted:
        raise ValueError("a report needs at least one run with figures")
    out_dir.mkdir(parents=True, exist_ok=True)
    analysis = analyse(plotted, data.tasks)
    plots = workers.draw(plot_tasks(data, analysis))
    parts = _parts(analysis, plots)
    accounts = _accounts(data)
    notes = _notes(data)
    cloud_runs = [run for run in data.runs if is_cloud(run)]
    files = ReportFiles(
        out_dir / "report.html",
        out_dir / "report.md",
        out_dir / "runs.csv",
        out_dir / "report.json",
    )
    files.html.write_text(
        render_html(
            TITLE,
            _meta(data),
            parts,
            analysis.colours,
            data.runs,
            accounts,
            cloud_runs,
            notes,
        ),
        encoding="utf-8",
    )
    files.markdown.write_text(_markdown(data, parts, accounts, notes), encoding="utf-8")
    rows = [
        {**run_row(run), **accounting_row(figures)}
        for run, figures in zip(data.runs, accounts, strict=True)
    ]
    with files.csv.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    files.json.write_text(_json(data, analysis, accounts, notes), encoding="utf-8")
    return files
