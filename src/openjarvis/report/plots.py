"""The report's plots, drawn with matplotlib and returned as inline SVG text.

Estimated energy is always drawn differently (hollow markers, hatched bars) and says so.
"""

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from openjarvis.report.drawing import (
    draw_svg,
    known,
    labels_width_in,
    log_scale_if_wide,
    row_labels,
    rows_height_in,
    spans,
    two_lines,
    whisker_rows,
)
from openjarvis.report.joules import Breakdown
from openjarvis.report.plot import Panel, Plot, Point
from openjarvis.report.runs import (
    Interval,
    concurrency_of,
    coverage_names,
    figure,
    hardware_label,
    is_cloud,
    is_estimate,
    model_label,
    pareto_frontier,
    scaled,
    short_label,
)
from openjarvis.store import PowerSeries, RunRecord

__all__ = [
    "accuracy_per_joule_plot",
    "concurrency_plot",
    "joules_plot",
    "local_vs_cloud_plot",
    "point_names",
    "power_traces_plot",
    "sections_plot",
    "tokens_plot",
]

MAX_TRACE_POINTS = 1500  # per source: more points than pixels only make the SVG heavy
MIN_FRONTIER_POINTS = 2  # a "frontier" of one run is no frontier: it is not drawn
PASSES_PER_KJ = 1000.0  # accuracy per joule times this: passes per kJ


def _whiskers(points: Sequence[Point], axis: str) -> list[list[float]] | None:
    if axis == "x":
        return spans([(p.energy_j, p.energy_low_j, p.energy_high_j) for p in points])
    return spans([(p.accuracy, p.accuracy_low, p.accuracy_high) for p in points])


def point_names(points: Sequence[Point]) -> list[str]:
    """Each point's name on its panel: the model, and the parts of its label that tell it
    apart from the panel's other points (`· 4 at once`, a run id), never two alike."""
    parts = [point.label.split(" · ") for point in points]
    shared = set.intersection(*(set(p[1:]) for p in parts)) if len(parts) > 1 else set()
    return [" · ".join([p[0], *(part for part in p[1:] if part not in shared)]) for p in parts]


def _draw_panel(
    axes: Axes, panel: Panel, frontier: Sequence[int], colours: Mapping[str, str], index: int
) -> None:
    groups: dict[tuple[str, bool, bool], list[Point]] = {}
    for point in panel.points:
        groups.setdefault((point.hardware, point.estimated, point.cloud), []).append(point)
    for (hardware, estimated, cloud), members in groups.items():
        colour = colours[hardware]
        axes.errorbar(
            [p.energy_j for p in members],
            [p.accuracy for p in members],
            xerr=_whiskers(members, "x"),
            yerr=_whiskers(members, "y"),
            fmt="D" if cloud else "o",
            linestyle="none",
            color=colour,
            markeredgecolor=colour,
            markerfacecolor="none" if estimated else colour,
            elinewidth=0.7,
            capsize=2,
        )
    for point, name in zip(panel.points, point_names(panel.points), strict=True):
        axes.annotate(
            name,
            (point.energy_j, point.accuracy),
            textcoords="offset points",
            xytext=(5, -10),
            fontsize=8,
            color="0.25",
        )
    if len(frontier) >= MIN_FRONTIER_POINTS:
        axes.plot(
            [panel.points[i].energy_j for i in frontier],
            [panel.points[i].accuracy for i in frontier],
            linestyle="--",
            color="black",
            linewidth=1,
            drawstyle="steps-post",
            gid=f"frontier-{index}",  # the SVG group's id: tests find the frontiers drawn
        )
    log_scale_if_wide(axes, [p.energy_j for p in panel.points], "x")
    axes.set_title(panel.title, fontsize=10, loc="left")
    axes.set_xlabel("mean energy per task (J), shared tasks only")
    axes.set_ylabel("accuracy (pass@1)")
    axes.set_ylim(-0.02, 1.02)
    axes.grid(alpha=0.3)


def sections_plot(panels: Sequence[Panel], colours: Mapping[str, str]) -> Plot:
    """One panel per section of the comparability gate: accuracy against mean joules per task
    on the section's shared tasks, and the Pareto frontier where it has two points or more."""

    frontiers = [
        pareto_frontier([(p.energy_j, p.accuracy) for p in panel.points]) for panel in panels
    ]

    def draw(fig: Figure) -> None:
        grid = np.atleast_1d(fig.subplots(len(panels), 1, squeeze=False)[:, 0])
        for index, (axes, panel, frontier) in enumerate(zip(grid, panels, frontiers, strict=True)):
            _draw_panel(axes, panel, frontier, colours, index)

    drawn = sum(len(frontier) >= MIN_FRONTIER_POINTS for frontier in frontiers)
    return Plot(
        "accuracy-vs-energy",
        "Accuracy versus energy per task, by comparable section",
        "One panel per suite, energy scope and method class, each on the tasks its runs share "
        "(n in its title). Colour is the hardware (legend above), hollow markers are estimated "
        "energy, diamonds cloud runs. Whiskers: 95 % Wilson interval of accuracy and 95 % "
        "bootstrap interval of energy. The dashed staircase is the Pareto frontier, drawn only "
        f"where two runs or more make one ({drawn} of {len(panels)} panels).",
        draw_svg(draw, 6.0, 3.4 * len(panels) + 0.3),
    )


def accuracy_per_joule_plot(groups: Sequence[RunRecord], colours: Mapping[str, str]) -> Plot:
    """Passes per kJ of the newest run of each configuration, with whiskers."""

    def draw(fig: Figure) -> None:
        axes = fig.add_subplot()
        whisker_rows(axes, groups, "accuracy_per_joule", dict(colours), scale=PASSES_PER_KJ)
        axes.set_xlabel("passes per kJ (accuracy per joule x 1000), higher is better")

    return Plot(
        "accuracy-per-joule",
        "Passes per kJ by configuration",
        "The newest run of each model, hardware and engine, each on all its own tasks (compare "
        "runs on shared tasks in the sections above); whiskers are 95 % bootstrap intervals over "
        "tasks. Hollow markers and '(estimate)' mark energy that was estimated, not measured.",
        draw_svg(draw, 5.0, rows_height_in(len(groups)), labels_width_in(row_labels(groups))),
    )


def tokens_plot(groups: Sequence[RunRecord], colours: Mapping[str, str]) -> Plot:
    """Joules per output token (with whiskers) against the decode rate, one point per
    configuration: fast and frugal is bottom right."""
    drawn = [run for run in groups if None not in (_rate(run), _per_token(run)[0])]
    missing = [run for run in groups if run not in drawn]

    def draw(fig: Figure) -> None:
        axes = fig.add_subplot()
        for run in drawn:
            colour = colours[hardware_label(run)]
            value, low, high = _per_token(run)
            (x,), (y,) = known([_rate(run)]), known([value])  # `drawn` has both
            axes.errorbar(
                [x],
                [y],
                yerr=spans([(value, low, high)]),
                fmt="D" if is_cloud(run) else "o",
                color=colour,
                markeredgecolor=colour,
                markerfacecolor="none" if is_estimate(run) else colour,
                capsize=3,
            )
            axes.annotate(
                model_label(run),
                (x, y),
                textcoords="offset points",
                xytext=(5, 4),
                fontsize=8,
                color="0.25",
            )
        axes.margins(x=0.15)  # room for the rightmost point's name
        log_scale_if_wide(axes, [_rate(run) for run in drawn], "x")
        log_scale_if_wide(axes, [_per_token(run)[0] for run in drawn], "y")
        axes.set_xlabel("decode tokens/s (median task), faster to the right")
        axes.set_ylabel("joules per output token")
        axes.grid(alpha=0.3)

    # An unknown rate is no point at 0 (it would read as measured): the caption names the run.
    unknown = (
        " No decode rate or energy per token (not drawn): "
        + ", ".join(short_label(run) for run in missing)
        + "."
        if missing
        else ""
    )
    return Plot(
        "tokens",
        "Joules per output token against decode rate",
        "One point per configuration on all its own tasks; whiskers are 95 % bootstrap intervals "
        "of joules per output token. Colour is the hardware, hollow markers are estimates."
        + unknown,
        draw_svg(draw, 6.0, 3.8),
    )


def _rate(run: RunRecord) -> float | None:
    return figure(run, "decode_tokens_per_s")[0]


def _per_token(run: RunRecord) -> Interval:
    return figure(run, "joules_per_output_token")


def _downsample(times: np.ndarray, watts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bucket means: keeps the trace's shape and its average power, unlike taking every n-th."""
    if times.size <= MAX_TRACE_POINTS:
        return times, watts
    edges = np.linspace(0, times.size, MAX_TRACE_POINTS + 1).astype(int)
    return (
        np.add.reduceat(times, edges[:-1]) / np.diff(edges),
        np.add.reduceat(watts, edges[:-1]) / np.diff(edges),
    )


def power_traces_plot(traces: Sequence[tuple[RunRecord, Mapping[str, PowerSeries]]]) -> Plot:
    """Power over time of each selected run, one panel per run, one line per source."""

    def draw(fig: Figure) -> None:
        panels = np.atleast_1d(fig.subplots(len(traces), 1, squeeze=False)[:, 0])
        for axes, (run, series) in zip(panels, traces, strict=True):
            in_scope = set(coverage_names(run.energy_coverage, "in_scope"))
            for source in sorted(series):
                times, watts = (np.frombuffer(values, dtype=float) for values in series[source])
                # A source traced but outside the run's scope is drawn dashed and says so: its
                # watts are not in the run's energy (a CPU estimate beside a GPU-only figure).
                outside = bool(in_scope) and source not in in_scope
                axes.plot(
                    *_downsample(times, watts),
                    linewidth=0.8,
                    linestyle="--" if outside else "-",
                    label=f"{source} (not in total)" if outside else source,
                )
            estimate = " (estimate)" if is_estimate(run) else ""
            axes.set_title(
                f"{(run.id or '')[:8]} · {short_label(run)}{estimate}",
                fontsize=9,
            )
            axes.set_ylabel("W")
            axes.grid(alpha=0.3)
            axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        panels[-1].set_xlabel("seconds since the run started")

    return Plot(
        "power-traces",
        "Power traces",
        f"Sampled power of {len(traces)} run(s) per energy source, averaged into at most "
        f"{MAX_TRACE_POINTS} points per source. Dashed lines, '(not in total)', are sources "
        "traced outside the run's energy scope: their watts are not in its figures.",
        draw_svg(draw, 6.5, 2.4 * len(traces) + 0.6, right_in=2.2),
    )


def local_vs_cloud_plot(groups: Sequence[RunRecord], colours: Mapping[str, str]) -> Plot:
    """Passes per kJ of local runs beside cloud runs, whose energy is always an estimate."""
    rows = sorted(groups, key=lambda run: (run.suite, is_cloud(run), model_label(run)))

    def draw(fig: Figure) -> None:
        axes = fig.add_subplot()
        # One barh call per hardware and kind of energy, as with errorbars.
        kinds: dict[tuple[str, bool], list[int]] = {}
        for row, run in enumerate(rows):
            if figure(run, "accuracy_per_joule")[0] is not None:
                kinds.setdefault((hardware_label(run), is_estimate(run)), []).append(row)
        for (hardware, estimated), members in kinds.items():
            intervals = [
                scaled(figure(rows[row], "accuracy_per_joule"), PASSES_PER_KJ) for row in members
            ]
            axes.barh(
                members,
                known(value for value, _, _ in intervals),
                xerr=spans(intervals),
                capsize=3,
                color="white" if estimated else colours[hardware],
                edgecolor=colours[hardware],
                hatch="///" if estimated else None,
            )
        axes.set_yticks(range(len(rows)), row_labels(rows))
        axes.set_ylim(len(rows) - 0.5, -0.5)
        values = [scaled(figure(r, "accuracy_per_joule"), PASSES_PER_KJ)[0] for r in rows]
        log_scale_if_wide(axes, values, "x")
        axes.set_xlabel("passes per kJ")
        axes.grid(axis="x", alpha=0.3)

    return Plot(
        "local-vs-cloud",
        "Local versus cloud",
        "Colour is the hardware; hatched bars are estimates: a cloud model's energy is output and "
        "input tokens times published joules per token times the data centre's PUE (the "
        "constants of each cloud run are listed below), never a measurement.",
        draw_svg(draw, 5.0, rows_height_in(len(rows)), labels_width_in(row_labels(rows))),
    )


def joules_plot(splits: Sequence[Breakdown], colours: Mapping[str, str]) -> Plot:
    """Per run, a bar of mean joules per task: the idle floor (grey) and the net draw above it
    by domain (the hardware's colour, lighter for CPU and DRAM), estimated parts hatched."""
    shown = [split for split in splits if split.gross_j is not None]
    labels = [two_lines(split.label) for split in shown]
    shade = {"gpu": 1.0, "cpu": 0.6, "dram": 0.35, "platform": 0.2}

    def draw(fig: Figure) -> None:
        axes = fig.add_subplot()
        for row, split in enumerate(shown):
            left = 0.0
            if split.idle_floor_j is not None:
                axes.barh(row, split.idle_floor_j, color="0.8", edgecolor="0.5")
                left = split.idle_floor_j
            if split.parts:
                for part in split.parts:
                    axes.barh(
                        row,
                        part.net_j,
                        left=left,
                        color=colours[split.hardware],
                        alpha=shade.get(part.domain, 0.5),
                        hatch="///" if part.estimated else None,
                        edgecolor=colours[split.hardware],
                    )
                    left += part.net_j
            elif split.gross_j is not None:  # no readings by domain: one net segment
                axes.barh(
                    row,
                    split.gross_j - left,
                    left=left,
                    color=colours[split.hardware],
                    alpha=0.7,
                    hatch="///" if split.estimated else None,
                    edgecolor=colours[split.hardware],
                )
                left = split.gross_j
            share = split.idle_share
            note = "idle unknown" if share is None else f"{share:.0%} idle"
            if split.cloud:
                note = "estimate, no idle floor"
            axes.text(left, row, f"  {note}", va="center", ha="left", fontsize=8, color="0.25")
        axes.set_yticks(range(len(shown)), labels)
        axes.set_ylim(len(shown) - 0.5, -0.5)
        axes.set_xlim(0, max(known(s.gross_j for s in shown), default=1.0) * 1.25)
        axes.set_xlabel("mean joules per task (each run on all its own tasks)")
        axes.grid(axis="x", alpha=0.3)

    return Plot(
        "joules",
        "Idle floor and net draw per task",
        "Grey: the idle floor (idle power measured before the run times task time). Coloured: "
        "the net draw above idle by domain, GPU darkest, then CPU, DRAM; hatched parts are "
        "estimated. A run whose bar is mostly grey spends most of its energy keeping the hardware "
        "on, not computing.",
        draw_svg(draw, 5.5, rows_height_in(len(shown)), labels_width_in(labels)),
    )


def concurrency_plot(series: Mapping[str, Sequence[RunRecord]], colours: Mapping[str, str]) -> Plot:
    """Passes per kJ against requests in flight, one line per configuration measured at two
    concurrencies or more (analysis.concurrency_series): where batching pays for the idle
    floor."""

    def draw(fig: Figure) -> None:
        axes = fig.add_subplot()
        for label, runs in series.items():
            intervals = [scaled(figure(run, "accuracy_per_joule"), PASSES_PER_KJ) for run in runs]
            colour = colours[hardware_label(runs[0])]
            # Every run of a series recorded its concurrency (analysis.concurrency_series).
            xs = known(None if (c := concurrency_of(run)) is None else float(c) for run in runs)
            axes.errorbar(
                xs,
                known(value for value, _, _ in intervals),
                yerr=spans(intervals),
                marker="o",
                color=colour,
                markerfacecolor="none" if is_estimate(runs[0]) else colour,
                capsize=3,
            )
            axes.annotate(
                label.split(" · ")[0],
                (xs[-1], known([intervals[-1][0]])[0]),
                textcoords="offset points",
                xytext=(5, 0),
                fontsize=8,
                color="0.25",
            )
        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axes.set_xlabel("requests in flight (concurrency)")
        axes.set_ylabel("passes per kJ")
        axes.grid(alpha=0.3)

    return Plot(
        "concurrency",
        "Passes per kJ against concurrency",
        "One line per model, hardware and engine measured at two concurrencies or more, each "
        "point a run on all its own tasks with its 95 % bootstrap interval. A line that rises "
        "means batching spreads the idle floor over more work.",
        draw_svg(draw, 6.0, 3.6),
    )
