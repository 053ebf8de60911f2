"""Drawing helpers the report's plots share: SVG output, fixed margins, one colour per hardware,
whiskers, and the marks that set estimated energy apart (hollow markers, '(estimate)' labels).
"""

import io
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator
from matplotlib.typing import RcKeyType

from openjarvis.report.runs import (
    Interval,
    distinct_labels,
    figure,
    hardware_label,
    is_cloud,
    is_estimate,
    run_tasks_text,
    scaled,
    suite_name,
)
from openjarvis.store import RunRecord

__all__ = [
    "draw_svg",
    "errorbars",
    "known",
    "labels_width_in",
    "log_scale_if_wide",
    "row_labels",
    "rows_height_in",
    "spans",
    "two_lines",
    "whisker_rows",
]

SVG_SETTINGS: dict[RcKeyType, Any] = {
    "svg.fonttype": "none",  # text stays text: smaller, searchable, no duplicated glyph ids
    "svg.hashsalt": "openjarvis",  # stable element ids, so the same data gives the same file
    "font.size": 10,  # still about 7 pt where a 600-px screen scales a plot down
}


def _svg(fig: Figure) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and doctype: the SVG goes inline


def draw_svg(
    draw: Callable[[Figure], None],
    plot_width_in: float,
    height_in: float,
    left_in: float = 0.8,
    right_in: float = 0.2,
) -> str:
    """Render `draw` to SVG; the figure is the plot area plus `left_in` for the y labels and
    `right_in` (room for a legend beside the axes, never over the data).

    Margins are fixed in inches: a layout engine (or bbox_inches="tight") measures every text
    by drawing the figure an extra time, which doubled the report's time.
    """
    width_in = left_in + plot_width_in + right_in
    with rc_context(SVG_SETTINGS):
        fig = Figure(figsize=(width_in, height_in))
        fig.subplots_adjust(
            left=left_in / width_in,
            right=1 - right_in / width_in,
            bottom=0.55 / height_in,
            top=1 - 0.35 / height_in,
            wspace=0.06,
            hspace=0.5,
        )
        draw(fig)
        return _svg(fig)


def labels_width_in(labels: Sequence[str]) -> float:
    """Room for y tick labels: about 0.6 em a character of the longest line at 10 pt."""
    lines = [line for label in labels for line in label.splitlines()]
    return 0.3 + max((len(line) for line in lines), default=0) * 10 * 0.6 / 72


def two_lines(label: str) -> str:
    """`model · hardware · engine` as `model` over `hardware · engine`: row labels half as wide,
    so the bars keep their room on a narrow screen."""
    return label.replace(" · ", "\n", 1)


def known(values: Iterable[float | None]) -> list[float]:
    """Figures of runs already filtered to those that have them: a None here is a bug."""
    result = []
    for value in values:
        assert value is not None, "a run without the figure was not filtered out"
        result.append(value)
    return result


def spans(intervals: Sequence[Interval]) -> list[list[float]] | None:
    """errorbar's [[below], [above]] distances; zero where an interval is unknown."""
    if all(low is None or high is None for _, low, high in intervals):
        return None
    below = [v - low if v is not None and low is not None else 0.0 for v, low, _ in intervals]
    above = [high - v if v is not None and high is not None else 0.0 for v, _, high in intervals]
    return [below, above]


def errorbars(
    axes: Axes,
    runs: Sequence[RunRecord],
    x_of: Callable[[RunRecord], Interval],
    y_of: Callable[[RunRecord], Interval],
    colours: dict[str, str],
    **style: Any,
) -> None:
    """Points with whiskers, one errorbar call per hardware and kind of energy.

    One call per run made a 200-run report spend ~10 s in matplotlib. Hollow markers are
    estimates, filled ones were measured; diamonds are cloud runs.
    """
    groups: dict[tuple[str, bool, bool], list[RunRecord]] = {}
    for run in runs:
        if x_of(run)[0] is not None and y_of(run)[0] is not None:
            key = (hardware_label(run), is_estimate(run), is_cloud(run))
            groups.setdefault(key, []).append(run)
    for (hardware, estimated, cloud), members in groups.items():
        xs, ys = [x_of(r) for r in members], [y_of(r) for r in members]
        colour = colours[hardware]
        axes.errorbar(
            known(x for x, _, _ in xs),
            known(y for y, _, _ in ys),
            xerr=spans(xs),
            yerr=spans(ys),
            fmt="D" if cloud else "o",
            linestyle="none",
            color=colour,
            markeredgecolor=colour,
            markerfacecolor="none" if estimated else colour,
            **style,
        )


def log_scale_if_wide(axes: Axes, values: Sequence[float | None], axis: str) -> None:
    """A log axis when the known positive values span more than 20x; unknowns (None) are
    ignored."""
    positive = [v for v in values if v is not None and v > 0]
    if not positive or max(positive) / min(positive) <= 20:
        return
    (axes.set_xscale if axis == "x" else axes.set_yscale)("log")
    target = axes.xaxis if axis == "x" else axes.yaxis
    # Plain tick labels: the default 10^n labels go through mathtext, which costs ~1 s a report.
    target.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    # No minor ticks: on log axes they are most of the ticks, and ticks are most of the drawing.
    target.set_minor_locator(NullLocator())


def row_labels(runs: Sequence[RunRecord]) -> list[str]:
    """`model · hardware · engine`, told apart where runs would read alike (runs.distinct_labels:
    the suite, the energy method and scope, the run id), the suite where the rows are of more
    than one, and n (the tasks behind the run's figures)."""
    labels = distinct_labels(runs)
    if len({suite_name(run) for run in runs}) > 1:  # rows of several suites name theirs
        for run in runs:
            label = labels[run.id or ""]
            if suite_name(run) not in label.split(" · "):
                labels[run.id or ""] = f"{label} · {suite_name(run)}"
    return [
        two_lines(labels[run.id or ""])
        + f" · n = {run_tasks_text(run)}"
        + (" (estimate)" if is_estimate(run) else "")
        for run in runs
    ]


def whisker_rows(
    axes: Axes,
    runs: Sequence[RunRecord],
    name: str,
    colours: dict[str, str],
    scale: float = 1.0,
) -> None:
    """One horizontal row per run: the figure's value (times `scale`, e.g. 1000 for passes per
    kJ) with its 95 % interval as whiskers."""
    rows = {run.id: float(row) for row, run in enumerate(runs)}
    errorbars(
        axes,
        runs,
        lambda run: scaled(figure(run, name), scale),
        lambda run: (rows[run.id], None, None),
        colours,
        capsize=3,
        elinewidth=1,
    )
    axes.set_yticks(range(len(runs)), row_labels(runs))
    axes.set_ylim(len(runs) - 0.5, -0.5)
    axes.grid(axis="x", alpha=0.3)
    log_scale_if_wide(axes, [scaled(figure(r, name), scale)[0] for r in runs], "x")


def rows_height_in(rows: int) -> float:
    """Two-line labels: about 0.45 in a row."""
    return max(2.0, 0.45 * rows + 1.2)
