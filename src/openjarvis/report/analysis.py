"""What `ipw report` computes from the runs before it draws or writes anything: the comparable
sections and their verdict, where each configuration's joules go, coverage and routing, the
scatter's points and one colour per hardware.
"""

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from openjarvis.report.accounting import accounting
from openjarvis.report.gate import (
    Entry,
    Headline,
    Section,
    gate,
    headline,
    section_frontier,
)
from openjarvis.report.joules import Breakdown, breakdown
from openjarvis.report.plot import Panel, Point, hardware_colours
from openjarvis.report.routing import Routing, routing, routing_json
from openjarvis.report.runs import (
    concurrency_of,
    distinct_labels,
    figure,
    hardware_label,
    is_cloud,
    is_estimate,
    model_label,
    newest_per_group,
    suite_name,
)
from openjarvis.store import RunRecord, TaskResultRecord

__all__ = ["Analysis", "analyse", "analysis_json", "concurrency_series", "panels"]


@dataclass(frozen=True, slots=True)
class Analysis:
    """What the report computes before drawing: the comparable sections and their verdict,
    where each configuration's joules go, coverage and routing per suite, and the colours."""

    groups: list[RunRecord]  # the newest run of each configuration
    sections: list[Section]
    headline: Headline
    splits: list[Breakdown]
    routings: list[tuple[str, Routing]]
    colours: dict[str, str]  # hardware label -> colour, the same in every chart
    concurrency_series: dict[str, list[RunRecord]]  # configurations at two concurrencies or more


def analyse(runs: Sequence[RunRecord], tasks: Mapping[str, Sequence[TaskResultRecord]]) -> Analysis:
    """Everything the report reads from `runs` (those with figures) and their saved tasks."""
    groups = newest_per_group(runs)
    sections = gate(groups, tasks)
    splits = []
    labels = distinct_labels(groups)
    for run in groups:
        saved = tasks.get(run.id or "", ())
        label = labels[run.id or ""]
        splits.append(breakdown(run, saved, accounting(run, saved), label, hardware_label(run)))
    routings = []
    for suite in sorted({suite_name(run) for run in groups}):
        found = routing([run for run in groups if suite_name(run) == suite], tasks)
        if found is not None:
            routings.append((suite, found))
    colours = hardware_colours(hardware_label(run) for run in runs)
    return Analysis(
        groups,
        sections,
        headline(sections),
        splits,
        routings,
        colours,
        concurrency_series(groups),
    )


def concurrency_series(groups: Sequence[RunRecord]) -> dict[str, list[RunRecord]]:
    """Runs of one model, hardware, engine and suite at two or more concurrencies, by label,
    in order of concurrency; configurations measured at one concurrency only are left out."""
    series: dict[str, list[RunRecord]] = {}
    for run in groups:
        if concurrency_of(run) is not None and figure(run, "accuracy_per_joule")[0] is not None:
            key = f"{model_label(run)} · {hardware_label(run)} · {run.engine} · {run.suite}"
            series.setdefault(key, []).append(run)
    return {
        key: sorted(runs, key=lambda run: concurrency_of(run) or 0)
        for key, runs in series.items()
        if len({concurrency_of(run) for run in runs}) >= 2
    }


def panels(sections: Sequence[Section]) -> list[Panel]:
    panels = []
    for section in sections:
        if len(section.entries) < 2:  # one point is no comparison: listed, not drawn
            continue
        points = []
        for entry in section.entries:
            energy = entry.figures.mean_energy_j
            interval = entry.accuracy_interval()
            if energy.value is None or interval is None:
                continue
            points.append(
                Point(
                    entry.label,
                    hardware_label(entry.run),
                    energy.value,
                    energy.low,
                    energy.high,
                    entry.passed / entry.trials,
                    interval[0],
                    interval[1],
                    is_estimate(entry.run),
                    is_cloud(entry.run),
                )
            )
        if points:
            panels.append(Panel(section.title, tuple(points)))
    return panels


def _entry_json(entry: Entry) -> dict[str, object]:
    interval = entry.accuracy_interval()
    band = entry.energy_band_j()
    return {
        "run_id": entry.run.id,
        "label": entry.label,
        "tasks": len(entry.task_ids),
        "passed": entry.passed,
        "samples": entry.trials,
        "accuracy_wilson_95": list(interval) if interval else None,
        "mean_energy_j": asdict(entry.figures.mean_energy_j),
        "accuracy_per_joule": asdict(entry.figures.accuracy_per_joule),
        "energy_estimate_band_j": list(band) if band else None,
    }


def analysis_json(analysis: Analysis) -> dict[str, object]:
    """The verdict, sections, frontiers (two points or more only), joules and routing as
    JSON-ready values: unknown figures stay null."""
    sections = analysis.sections
    frontiers = [[entry.run.id for entry in section_frontier(section)] for section in sections]
    return {
        "verdict": [v.to_json() for v in (*analysis.headline.within, *analysis.headline.across)],
        "sections": [
            {
                "title": section.title,
                "suite": section.suite,
                "energy_scope": section.scope,
                "measured": section.measured,
                "tasks": len(section.task_ids),
                "runs": [_entry_json(entry) for entry in section.entries],
                "pareto_frontier": frontier,
                "left_out": [{"run_id": run.id, "why": why} for run, why in section.left_out],
            }
            for section, frontier in zip(sections, frontiers, strict=True)
        ],
        "pareto_frontiers": {
            section.title: frontier
            for section, frontier in zip(sections, frontiers, strict=True)
            if frontier
        },
        "where_the_joules_go": [asdict(split) for split in analysis.splits],
        "routing": {suite: routing_json(found) for suite, found in analysis.routings},
    }
