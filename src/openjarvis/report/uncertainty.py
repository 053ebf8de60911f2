"""How sure a report's figures are: Wilson intervals for accuracy, the stated error band of
estimated energy, and the small-n warning (docs/report.md, "Uncertainty").
"""

import math
from dataclasses import dataclass

from openjarvis.report.runs import figure, format_interval, is_cloud, mark_estimate, scaled
from openjarvis.store import RunRecord

__all__ = [
    "SMALL_N_TASKS",
    "EstimateBand",
    "banded_energy_j",
    "estimate_band",
    "run_figure_text",
    "small_n_warning",
    "wilson_interval",
]

Z_95 = 1.959964  # two-sided 95 % normal quantile
# Below this many tasks an accuracy interval is wider than about ±17 points at 50 %: the report
# says so beside every figure that rests on so few.
SMALL_N_TASKS = 30


def wilson_interval(passed: int, trials: int) -> tuple[float, float] | None:
    """The 95 % Wilson score interval of a pass rate; None without trials.

    Unlike the bootstrap over tasks it stays honest at the edges: 0 of 5 is [0, 0.43], not [0, 0].
    """
    if trials <= 0:
        return None
    if not 0 <= passed <= trials:
        raise ValueError(f"{passed} passed of {trials} trials")
    rate = passed / trials
    z2 = Z_95 * Z_95
    denominator = 1 + z2 / trials
    centre = (rate + z2 / (2 * trials)) / denominator
    half = Z_95 * math.sqrt(rate * (1 - rate) / trials + z2 / (4 * trials * trials)) / denominator
    # The interval holds the rate; rounding can leave 1 of 1 a hair outside its upper end.
    return min(rate, max(0.0, centre - half)), max(rate, min(1.0, centre + half))


@dataclass(frozen=True, slots=True)
class EstimateBand:
    """Factors by which an estimated energy may be off, by the estimate's own model; a
    stated assumption of this project, not a measured error."""

    low_factor: float
    high_factor: float
    why: str


# The CPU estimate (data/cpu_tdp.csv) charges a share of the chip's TDP by utilisation: TDP is a
# thermal design limit, not a power reading, and the idle share is assumed (0.15 or 0.30).
CPU_ESTIMATE_BAND = EstimateBand(
    0.5,
    1.5,
    "CPU power from utilisation times TDP share (data/cpu_tdp.csv): TDP is a design limit, "
    "not a reading, and the idle share is assumed",
)
# The cloud estimate (data/cloud_energy.csv) applies one published joules-per-token figure of a
# reference model class, accelerator and batch size to every model of its class.
CLOUD_ESTIMATE_BAND = EstimateBand(
    0.5,
    2.0,
    "cloud energy from published joules per token of a reference model and batch size "
    "(data/cloud_energy.csv), applied to a whole model class",
)


def estimate_band(run: RunRecord) -> EstimateBand | None:
    """The stated error band of a run's estimated energy; None for measured runs."""
    if run.energy_method != "estimate":
        return None
    return CLOUD_ESTIMATE_BAND if is_cloud(run) else CPU_ESTIMATE_BAND


def small_n_warning(tasks: int) -> str | None:
    """One sentence when `tasks` is too few for the figures to be read as settled."""
    if tasks >= SMALL_N_TASKS:
        return None
    interval = wilson_interval(tasks // 2, tasks) if tasks else None
    width = (
        f" ({tasks // 2} of {tasks} passing spans {interval[0]:.0%} to {interval[1]:.0%} at 95 %)"
        if interval
        else ""
    )
    return f"small n, {tasks} task{'s' if tasks != 1 else ''}{width}; read differences as tentative"


def banded_energy_j(
    energy_j: float | None, estimated_j: float | None, band: EstimateBand | None
) -> tuple[float, float] | None:
    """The range an energy may lie in when `estimated_j` of it is estimated under `band`
    (the measured rest taken as exact); None when it is unknown or nothing is estimated."""
    if energy_j is None or estimated_j is None or band is None or estimated_j <= 0:
        return None
    return (
        energy_j - estimated_j * (1 - band.low_factor),
        energy_j + estimated_j * (band.high_factor - 1),
    )


# Ratios with accuracy on top: a run that passed nothing has 0 in every resample, and an
# interval of [0, 0] would claim a certainty that 0 passes lack.
ACCURACY_RATIOS = (
    "accuracy_per_joule",
    "accuracy_per_joule_net",
    "accuracy_per_watt",
    "accuracy_per_watt_net",
)


def _stored_accuracy_text(run: RunRecord) -> str | None:
    """`passed/trials = rate [Wilson]` from the stored summary; None where the counts cannot be
    told (no summary, or tasks sampled unequally, so the rate is no count over trials)."""
    summary = run.summary or {}
    accuracy = figure(run, "accuracy")[0]
    tasks, samples = summary.get("tasks"), summary.get("samples")
    if accuracy is None or not isinstance(tasks, int) or not isinstance(samples, int):
        return None
    trials = tasks * samples
    passed = round(accuracy * trials)
    interval = wilson_interval(passed, trials)
    if interval is None or abs(passed / trials - accuracy) > 1e-9:
        return None
    return f"{passed}/{trials} = {accuracy:.0%} [{interval[0]:.0%}, {interval[1]:.0%}]"


def run_figure_text(run: RunRecord, name: str, scale: float = 1.0) -> str:
    """A figure of the run's stored summary as the runs tables show it: accuracy as
    `passed/trials = rate [Wilson interval]` where the summary gives the counts, a ratio over a
    run that passed nothing as `0 (none passed)`, energy figures of estimates marked `est.`."""
    if name == "accuracy":
        return _stored_accuracy_text(run) or format_interval(*figure(run, name))
    none_passed = figure(run, "accuracy")[0] == 0
    if name in ACCURACY_RATIOS and none_passed and figure(run, name)[0] is not None:
        return mark_estimate("0 (none passed)", run)
    return mark_estimate(format_interval(*scaled(figure(run, name), scale)), run)
