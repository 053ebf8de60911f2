"""The report's plots, drawn with matplotlib and returned as inline SVG text.

Estimated energy is always drawn differently (hollow markers, hatched bars) and says so.
"""

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from openjarvis.report.drawing import (
    draw_svg,
    errorbars,
    host_colours,
    known,
    labels_width_in,
    legend_for_hosts,
    log_scale_if_wide,
    row_labels,
    rows_height_in,
    spans,
    whisker_rows,
)
from openjarvis.report.plot import Plot
from openjarvis.report.runs import figure, frontiers, host_label, is_cloud, is_estimate, model_label
from openjarvis.store import PowerSeries, RunRecord

__all__ = [
    "accuracy_per_joule_plot",
    "accuracy_vs_energy_plot",
    "local_vs_cloud_plot",
    "power_traces_plot",
    "tokens_plot",
]

MAX_TRACE_POINTS = 1500  # per source: more points than pixels only make the SVG heavy


def accuracy_vs_energy_plot(runs: Sequence[RunRecord]) -> Plot:
    """Each run's accuracy against its mean joules per task, with each group's Pareto frontier."""
    points = [
        r for r in runs if None not in (figure(r, "accuracy")[0], figure(r, "mean_energy_j")[0])
    ]
    colours = host_colours(points)

    def draw(fig: Figure) -> None:
        axes = fig.add_subplot()
        errorbars(
            axes,
            points,
            lambda run: figure(run, "mean_energy_j"),
            lambda run: figure(run, "accuracy"),
            colours,
            elinewidth=0.6,
            alpha=0.9,
        )
        for (group, members), style in zip(
            frontiers(points).items(), ("-", "--", ":", "-."), strict=False
        ):
            xs = known(figure(r, "mean_energy_j")[0] for r in members)
            ys = known(figure(r, "accuracy")[0] for r in members)
            axes.plot(
                xs,
                ys,
                linestyle=style,
                color="black",
                linewidth=1,
                drawstyle="steps-post",
                label=f"Pareto frontier: {group}",
            )
            for run, x, y in zip(members, xs, ys, strict=True):
                axes.annotate(
                    model_label(run), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7
                )
        log_scale_if_wide(axes, [figure(r, "mean_energy_j")[0] for r in points], "x")
        axes.set_xlabel("mean energy per task (J)")
        axes.set_ylabel("accuracy (pass@1)")
        axes.grid(alpha=0.3)
        legend_for_hosts(axes, colours, any(is_estimate(r) for r in points))

    return Plot(
        "accuracy-vs-energy",
        "Accuracy versus energy per task",
        "One point per run, one colour per host, whiskers are 95 % intervals. The staircase is "
        "the Pareto frontier (no run uses less energy with higher accuracy), drawn separately for "
        "each energy scope and for measured and estimated energy. Diamonds are cloud runs.",
        draw_svg(draw, 7.5, 5.0),
    )


def accuracy_per_joule_plot(groups: Sequence[RunRecord]) -> Plot:
    """Accuracy per joule of the newest run of each model, host and suite, with whiskers."""
    colours = host_colours(groups)

    def draw(fig: Figure) -> None:
        axes = fig.add_subplot()
        whisker_rows(axes, groups, "accuracy_per_joule", colours)
        axes.set_xlabel("accuracy per joule (1/J), higher is better")

    return Plot(
        "accuracy-per-joule",
        "Accuracy per joule by model and host",
        "The newest run of each model, host and suite; whiskers are 95 % bootstrap intervals "
        "over tasks. Hollow markers and '(estimate)' mark energy that was estimated, not measured.",
        draw_svg(draw, 5.0, rows_height_in(len(groups)), labels_width_in(row_labels(groups))),
    )


def tokens_plot(groups: Sequence[RunRecord]) -> Plot:
    """Joules per output token (with whiskers) beside the decode rate, per model and host."""
    colours = host_colours(groups)

    def draw(fig: Figure) -> None:
        energy_axes, rate_axes = fig.subplots(1, 2, sharey=True)
        whisker_rows(energy_axes, groups, "joules_per_output_token", colours)
        energy_axes.set_xlabel("joules per output token, lower is better")
        rates = [figure(run, "decode_tokens_per_s")[0] for run in groups]
        known = [row for row, rate in enumerate(rates) if rate is not None]
        rate_axes.barh(
            known,
            [rates[row] for row in known],
            color=[colours[host_label(groups[row])] for row in known],
        )
        # An unknown rate gets no bar (a bar of 0 would read as measured) and says so.
        for row, rate in enumerate(rates):
            if rate is None:
                rate_axes.text(0, row, " — unknown", va="center", ha="left", color="0.4")
        rate_axes.set_xlabel("decode tokens/s (median task)")
        rate_axes.grid(axis="x", alpha=0.3)

    return Plot(
        "tokens",
        "Joules per output token and decode rate",
        "Left: joules per output token with 95 % intervals. Right: the median task's decode rate "
        "('— unknown' where a run has none).",
        draw_svg(draw, 7.0, rows_height_in(len(groups)), labels_width_in(row_labels(groups))),
    )


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
            for source in sorted(series):
                times, watts = (np.frombuffer(values, dtype=float) for values in series[source])
                axes.plot(*_downsample(times, watts), linewidth=0.8, label=source)
            estimate = " (estimate)" if is_estimate(run) else ""
            axes.set_title(
                f"{(run.id or '')[:8]} · {model_label(run)} · {host_label(run)}{estimate}",
                fontsize=9,
            )
            axes.set_ylabel("W")
            axes.grid(alpha=0.3)
            axes.legend(fontsize=7, loc="upper right")
        panels[-1].set_xlabel("seconds since the run started")

    return Plot(
        "power-traces",
        "Power traces",
        f"Sampled power of {len(traces)} run(s) per energy source, averaged into at most "
        f"{MAX_TRACE_POINTS} points per source.",
        draw_svg(draw, 9.0, 2.4 * len(traces) + 0.6),
    )


def local_vs_cloud_plot(groups: Sequence[RunRecord]) -> Plot:
    """Accuracy per joule of local runs beside cloud runs, whose energy is always an estimate."""
    rows = sorted(groups, key=lambda run: (run.suite, is_cloud(run), model_label(run)))

    def draw(fig: Figure) -> None:
        axes = fig.add_subplot()
        # One barh call per kind (local or cloud, measured or estimated), as with errorbars.
        kinds: dict[tuple[bool, bool], list[int]] = {}
        for row, run in enumerate(rows):
            if figure(run, "accuracy_per_joule")[0] is not None:
                kinds.setdefault((is_cloud(run), is_estimate(run)), []).append(row)
        for (cloud, estimated), members in kinds.items():
            intervals = [figure(rows[row], "accuracy_per_joule") for row in members]
            axes.barh(
                members,
                known(value for value, _, _ in intervals),
                xerr=spans(intervals),
                capsize=3,
                color="white" if estimated else ("C1" if cloud else "C0"),
                edgecolor="C1" if cloud else "C0",
                hatch="///" if estimated else None,
            )
        axes.set_yticks(range(len(rows)), row_labels(rows))
        axes.set_ylim(len(rows) - 0.5, -0.5)
        log_scale_if_wide(axes, [figure(r, "accuracy_per_joule")[0] for r in rows], "x")
        axes.set_xlabel("accuracy per joule (1/J)")
        axes.grid(axis="x", alpha=0.3)

    return Plot(
        "local-vs-cloud",
        "Local versus cloud",
        "Blue: local runs; orange: cloud runs. Hatched bars are estimates: a cloud model's energy "
        "is output and input tokens times published joules per token times the data centre's "
        "PUE (the constants of each cloud run are listed below), never a measurement.",
        draw_svg(draw, 5.0, rows_height_in(len(rows)), labels_width_in(row_labels(rows))),
    )
