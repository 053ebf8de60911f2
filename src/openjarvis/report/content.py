"""The report's reading sections as plain blocks (sentences and tables of text), rendered once
into HTML (report/html.py) and once into Markdown (report/write.py): the verdict, the
comparable sections, the configurations, where the joules go, and coverage and routing.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from openjarvis.intervals import small_n_caution
from openjarvis.report.configuration import (
    CONFIGURATION_HEADINGS,
    configuration_cells,
    precision_label,
)
from openjarvis.report.gate import Entry, Headline, Section, section_frontier
from openjarvis.report.joules import Breakdown, breakdown_sentence
from openjarvis.report.routing import Route, Routing
from openjarvis.report.runs import energy_label, format_interval, format_value, short_label
from openjarvis.report.uncertainty import estimate_band
from openjarvis.store import RunRecord

__all__ = [
    "Block",
    "Line",
    "TextTable",
    "accuracy_text",
    "configuration_block",
    "gate_blocks",
    "headline_block",
    "joules_block",
    "routing_blocks",
]

PASSES_PER_KJ = 1000.0


@dataclass(frozen=True, slots=True)
class TextTable:
    headings: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True, slots=True)
class Line:
    """A paragraph; a `limit` is what qualifies the one before it (shown set apart)."""

    text: str
    limit: bool = False


@dataclass(frozen=True, slots=True)
class Block:
    """A titled part of the report: paragraphs, then tables."""

    id: str
    title: str
    lines: tuple[Line, ...] = ()
    tables: tuple[TextTable, ...] = ()
    level: int = 2  # heading level: 2 for a part, 3 inside one


def _lines(paragraphs: Sequence[str], limits: Sequence[str] = ()) -> tuple[Line, ...]:
    return (*(Line(text) for text in paragraphs), *(Line(text, limit=True) for text in limits))


def accuracy_text(entry: Entry) -> str:
    """`3/5 = 60 % [23 %, 88 %]`: passed over samples, with the 95 % Wilson interval."""
    interval = entry.accuracy_interval()
    if interval is None:
        return "—"
    rate = entry.passed / entry.trials
    return f"{entry.passed}/{entry.trials} = {rate:.0%} [{interval[0]:.0%}, {interval[1]:.0%}]"


def _energy_text(entry: Entry) -> str:
    """J per task with its bootstrap interval; an estimate says so and gives its stated band."""
    figure = entry.figures.mean_energy_j
    text = format_interval(figure.value, figure.low, figure.high)
    band = entry.energy_band_j()
    if text != "—" and estimate_band(entry.run) is not None:
        text += " est."
        if band is not None:
            text += f" (band {format_value(band[0])} to {format_value(band[1])})"
    return text


def _passes_per_kj_text(entry: Entry) -> str:
    figure = entry.figures.accuracy_per_joule
    if entry.passed == 0 and figure.value is not None:
        # Every resample is 0 too: an interval of [0, 0] would claim a certainty 0 passes lack.
        return "0 (none passed)"
    if figure.value is None:
        return f"— ({figure.null_reason})" if figure.null_reason else "—"
    scale = PASSES_PER_KJ
    low = None if figure.low is None else figure.low * scale
    high = None if figure.high is None else figure.high * scale
    text = format_interval(figure.value * scale, low, high)
    return f"{text} est." if estimate_band(entry.run) is not None else text


ENTRY_HEADINGS = (
    "run",
    "model · hardware · engine",
    "energy",
    "precision",
    "n",
    "accuracy [95 % Wilson]",
    "J per task [95 %]",
    "passes per kJ [95 %]",
)


def _entry_row(entry: Entry) -> tuple[str, ...]:
    return (
        (entry.run.id or "")[:8],
        entry.label,
        energy_label(entry.run),
        precision_label(entry.run),
        str(len(entry.task_ids)),
        accuracy_text(entry),
        _energy_text(entry),
        _passes_per_kj_text(entry),
    )


def headline_block(head: Headline) -> Block:
    """The first thing on the page: one verdict per comparable section, the best runs of
    other sections against the first labelled as not like for like, and what limits each."""
    lines: list[Line] = []
    for found in head.within:
        lines += [Line(found.sentence()), Line(found.limits_sentence(), limit=True)]
    for found in head.across:
        lines.append(Line(f"Across sections, not like for like: {found.sentence()}"))
        lines.append(Line(found.limits_sentence(), limit=True))
    alone = [section for section in head.sections if len(section.entries) == 1]
    if alone:
        lines.append(
            Line(
                f"{len(alone)} of {len(head.sections)} sections hold one run each, with nothing "
                "of their suite, scope and method class to compare it with: listed below, not "
                "drawn."
            )
        )
    if not any(section.entries for section in head.sections):
        lines.append(Line("No run has saved tasks to compare."))
    rows = tuple(
        (section.title, *_entry_row(section.entries[0])[1:])
        for section in head.sections
        if section.entries
    )
    table = TextTable(("section: its leader", *ENTRY_HEADINGS[1:]), rows)
    return Block("headline", "Verdict", tuple(lines), (table,))


def gate_blocks(sections: Sequence[Section]) -> list[Block]:
    """One block per section: its runs on its shared tasks, the frontier, who was left out."""
    blocks = [
        Block(
            "gate",
            "Comparable sections",
            _lines(
                [
                    "Runs are compared only within one suite, energy scope and method class "
                    "(measured or estimated), and only on the tasks all of them ran; n is that "
                    "count. A section's figures can differ from a run's own figures over all its "
                    "tasks (the runs table at the end)."
                ]
            ),
        )
    ]
    alone = [section for section in sections if len(section.entries) == 1]
    for section in sections:
        if section in alone:
            continue
        paragraphs = []
        frontier = section_frontier(section)
        if frontier:
            paragraphs.append(
                "Pareto frontier (no run uses less energy with higher accuracy): "
                + ", ".join(entry.label for entry in frontier)
                + "."
            )
        elif len(section.entries) < 2:
            paragraphs.append("One run: no frontier is drawn.")
        else:
            paragraphs.append("One run beats the others on both axes: no frontier is drawn.")
        warnings = [f"{short_label(run)} left out: {why}." for run, why in section.left_out]
        warning = small_n_caution(
            len(section.task_ids), [(entry.passed, entry.trials) for entry in section.entries]
        )
        if warning and section.entries:
            warnings.insert(0, warning[0].upper() + warning[1:] + ".")
        table = TextTable(ENTRY_HEADINGS, tuple(_entry_row(e) for e in section.entries))
        blocks.append(
            Block(
                f"section-{section.slug}",
                section.title,
                _lines(paragraphs, warnings),
                (table,) if section.entries else (),
                level=3,
            )
        )
    if alone:
        rows = tuple((section.title, *_entry_row(section.entries[0])) for section in alone)
        blocks.append(
            Block(
                "sections-of-one-run",
                "Sections of one run",
                _lines(
                    [
                        "Each of these runs is alone in its suite, energy scope and method "
                        "class: its figures over its own tasks, with nothing to compare them with."
                    ]
                ),
                (TextTable(("section", *ENTRY_HEADINGS), rows),),
                level=3,
            )
        )
    return blocks


def configuration_block(runs: Sequence[RunRecord]) -> Block:
    rows = tuple(tuple(cells) for cells in configuration_cells(runs))
    return Block(
        "configuration",
        "Configurations",
        _lines(
            [
                "What each run was, beside its results: a dash is what the run did not record "
                "(concurrency is shown only where the run recorded it). Hardware names the "
                "machine's GPUs or CPU; host adds its hostname."
            ]
        ),
        tables=(TextTable(CONFIGURATION_HEADINGS, rows),),
    )


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


JOULES_HEADINGS = (
    "model · hardware · engine",
    "n",
    "J per task",
    "idle floor J",
    "idle share",
    "net J by domain",
    "mean W",
    "idle W",
    "decode memory-bandwidth use",
    "prefill J",
    "decode J",
    "tail share",
    "short windows",
    "net < 0 tasks",
)


def _domains(split: Breakdown) -> str:
    if not split.parts:
        return "—"
    return ", ".join(
        f"{part.domain} {format_value(part.net_j)}{' est.' if part.estimated else ''}"
        for part in split.parts
    )


def joules_block(splits: Sequence[Breakdown]) -> Block:
    rows = tuple(
        (
            split.label,
            "—" if split.tasks is None else str(split.tasks),
            format_value(split.gross_j),
            format_value(split.idle_floor_j),
            _share(split.idle_share),
            _domains(split),
            format_value(split.mean_power_w),
            format_value(split.idle_power_w),
            "—" if split.memory_bandwidth_use is None else f"{split.memory_bandwidth_use:.1%}",
            format_value(split.prefill_j),
            format_value(split.decode_j),
            _share(split.tail_share),
            _share(split.low_resolution_share),
            "—" if split.negative_net_tasks is None else str(split.negative_net_tasks),
        )
        for split in splits
    )
    warnings = [
        f"{split.label}: {split.negative_net_tasks} task(s) drew less than the idle baseline "
        "(net energy below 0): the baseline drifted or the windows were too short to resolve."
        for split in splits
        if split.negative_net_tasks
    ]
    warnings += [
        f"{split.label}: {', '.join(split.out_of_scope)} read but outside the run's energy "
        "scope, so not in its total (e.g. a traced CPU line beside a GPU-only figure)."
        for split in splits
        if split.out_of_scope
    ]
    return Block(
        "joules",
        "Where the joules go",
        _lines([breakdown_sentence(split) for split in splits], warnings),
        (TextTable(JOULES_HEADINGS, rows),),
    )


ROUTE_HEADINGS = ("route", "accuracy", "J per task", "API $ per task")


def _route_row(route: Route) -> tuple[str, ...]:
    energy = format_value(route.energy_j)
    if route.estimated and energy != "—":
        energy += " (incl. est.)"
    cost = "—" if route.cost_usd is None else f"{route.cost_usd:.4g}"
    return (route.name, f"{route.accuracy:.1%}", energy, cost)


def routing_blocks(found: Sequence[tuple[str, Routing]]) -> list[Block]:
    """One block per suite whose runs share tasks: coverage, oracle, best single run, cloud,
    and the router curve for accuracy p from 0.5 to 1 (when a cloud run shares the tasks)."""
    blocks = []
    for suite, routing in found:
        paragraphs = [
            f"Over the {routing.tasks} tasks that {len(routing.runs)} runs of {suite} share: "
            f"{routing.coverage:.0%} are solved by at least one run"
            + (
                f", {routing.local_coverage:.0%} by a local run."
                if routing.local_coverage is not None
                else "."
            ),
            "The oracle sends each task to the lowest-energy run that solves it (at least half "
            "its samples pass), the oracle by API cost to the cheapest (then lowest-energy) "
            "one, and a task none solves to the most accurate run. Energies mix "
            "the runs' scopes and methods: read them as a bound on what routing could save.",
        ]
        tables = [TextTable(ROUTE_HEADINGS, tuple(_route_row(r) for r in routing.routes()))]
        if routing.router:
            paragraphs.append(
                "A router with accuracy p picks, for each task, between the best local choice "
                "and the cloud run: with probability p where the two-choice oracle sends it, "
                "else the other; its figures are expectations."
            )
            curve = tuple((f"{p:.1f}", *_route_row(route)[1:]) for p, route in routing.router)
            tables.append(TextTable(("router accuracy p", *ROUTE_HEADINGS[1:]), curve))
        else:
            paragraphs.append("No cloud run shares these tasks: no router curve.")
        warnings = [f"{short_label(run)} left out: {why}." for run, why in routing.left_out]
        blocks.append(
            Block(
                f"routing-{suite}",
                f"Coverage and routing · {suite} · n = {routing.tasks}",
                _lines(paragraphs, warnings),
                tuple(tables),
            )
        )
    return blocks
