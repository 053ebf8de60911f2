"""How sure a report's figures are: the stated error band of estimated energy, and the runs
table's text of a stored figure (docs/report.md, "Uncertainty"). Intervals themselves come from
intervals.py, as in every command.
"""

from dataclasses import dataclass

from openjarvis.intervals import wilson
from openjarvis.metrics import ACCURACY_RATIOS
from openjarvis.report.runs import figure, format_interval, is_cloud, mark_estimate, scaled
from openjarvis.store import RunRecord

__all__ = [
    "EstimateBand",
    "banded_energy_j",
    "estimate_band",
    "run_figure_text",
]


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
    interval = wilson(passed, trials)
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
