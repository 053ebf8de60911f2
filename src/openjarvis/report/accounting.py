"""What the meter says of a run beyond its figures (docs/energy.md): the prefill/decode split,
the tail's share, window flags, conservation and idle drift, as report tables and rows show them.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from openjarvis.metrics import phase_energy, window_flags
from openjarvis.report.runs import coverage_missing, coverage_names, format_value, mark_estimate
from openjarvis.store import RunRecord, TaskResultRecord

__all__ = [
    "ACCOUNTING_HEADINGS",
    "ACCOUNTING_NOTE",
    "Accounting",
    "WindowFlags",
    "accounting",
    "accounting_cells",
    "accounting_row",
]

# Table headings, in the order of accounting_cells.
ACCOUNTING_HEADINGS = (
    "prefill J per prompt token",
    "decode J per output token",
    "tail share of net J",
    "windows",
    "conservation",
    "idle drift W",
)

ACCOUNTING_NOTE = (
    "Prefill J per prompt token is the energy each request drew until its first token, per "
    "prompt token; decode J per output token is the rest, tail included, per output token. "
    "The tail is the energy above idle drawn after a task returned until the next one began (the "
    "device winding down), shown as a share of the run's net energy. Windows counts the tasks "
    "whose windows were shorter than ten counter refreshes (each one's figure is then less "
    "certain, though their total is exact), that overlapped another task, or that had over a "
    "quarter of their net energy in the tail. Conservation divides the tasks' net energies by "
    "the counters' net energy over the whole run, so 1.00 means no joule was lost or counted "
    "twice; idle drift is the idle power measured after the tasks minus before, summed over the "
    "sources in scope. A dash means the run has no such figure (it was measured before the meter "
    "kept them, or has no net energy, like a cloud estimate); docs/energy.md explains how each "
    "is measured."
)


@dataclass(frozen=True, slots=True)
class WindowFlags:
    """How many of a run's tasks had each flag of metrics.window_flags."""

    tasks: int
    low_resolution: int  # windows shorter than ten counter refreshes
    overlapped: int
    large_tail: int  # over a quarter of the task's net energy in its tail


@dataclass(frozen=True, slots=True)
class Accounting:
    """None where the run did not record a figure, as for runs measured before the meter kept
    it, or where it is undefined (unknown energy, no prompt tokens, net energy not above 0)."""

    prefill_j_per_prompt_token: float | None
    decode_j_per_output_token: float | None
    tail_share_of_net_energy: float | None
    window_flags: WindowFlags | None
    conservation_ratio: float | None
    idle_drift_w: float | None


def accounting(run: RunRecord, tasks: Sequence[TaskResultRecord]) -> Accounting:
    """The run's accounting, from its task records where given (the summary `ipw measure`
    stored when it finished is used only for what it alone has, or when no tasks are given)."""
    summary = run.summary or {}
    if tasks:
        phase: Mapping[str, object] = phase_energy(tasks)
    else:
        stored_phase = summary.get("phase_energy")
        phase = stored_phase if isinstance(stored_phase, dict) else {}
    conservation = summary.get("conservation")
    return Accounting(
        prefill_j_per_prompt_token=_number(phase.get("prefill_j_per_prompt_token")),
        decode_j_per_output_token=_number(phase.get("decode_j_per_output_token")),
        tail_share_of_net_energy=_number(phase.get("tail_share_of_net_energy")),
        window_flags=_window_flags(summary.get("windows"), tasks),
        conservation_ratio=(
            _number(conservation.get("ratio")) if isinstance(conservation, dict) else None
        ),
        idle_drift_w=_idle_drift_w(run),
    )


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _records_windows(task: TaskResultRecord) -> bool:
    """Whether the task was saved by a meter that kept window edges (a tail, a first-token
    split or an overlap); older tasks read as never overlapping, which is not known."""
    split = (task.tail_energy_j, task.prefill_energy_j, task.decode_energy_j)
    return task.overlapped or any(value is not None for value in split)


def _window_flags(stored: object, tasks: Sequence[TaskResultRecord]) -> WindowFlags | None:
    """Counted from the tasks when the run recorded windows (its summary has the counts, or a
    task has the fields), else the stored counts; None for runs from before they were kept."""
    counts: object = stored
    if tasks and (isinstance(stored, dict) or any(_records_windows(task) for task in tasks)):
        counts = window_flags(tasks)
    if not isinstance(counts, dict):
        return None
    keys = ("tasks", "low_resolution", "overlapped", "large_tail")
    values = [value for key in keys if isinstance(value := counts.get(key), int)]
    return WindowFlags(*values) if len(values) == len(keys) else None


def _idle_drift_w(run: RunRecord) -> float | None:
    """Idle power after the tasks minus before, summed over the sources in scope that could be
    read; None when either reading of one of them is unknown or the run has no scope recorded."""
    missing = coverage_missing(run.energy_coverage)
    names = [n for n in coverage_names(run.energy_coverage, "in_scope") if n not in missing]
    if not names:
        return None
    drift_w = 0.0
    for name in names:
        before_w, after_w = run.idle_power_w.get(name), run.idle_after_power_w.get(name)
        if before_w is None or after_w is None:
            return None
        drift_w += after_w - before_w
    return drift_w


def accounting_row(figures: Accounting) -> dict[str, float | int | None]:
    """Flat columns for CSV, and the run's `energy_accounting` in JSON (None stays null)."""
    flags = figures.window_flags
    return {
        "prefill_j_per_prompt_token": figures.prefill_j_per_prompt_token,
        "decode_j_per_output_token": figures.decode_j_per_output_token,
        "tail_share_of_net_energy": figures.tail_share_of_net_energy,
        "windows_low_resolution": flags.low_resolution if flags else None,
        "windows_overlapped": flags.overlapped if flags else None,
        "windows_large_tail": flags.large_tail if flags else None,
        "conservation_ratio": figures.conservation_ratio,
        "idle_drift_w": figures.idle_drift_w,
    }


def accounting_cells(run: RunRecord, figures: Accounting) -> list[str]:
    """Table cells under ACCOUNTING_HEADINGS, three significant digits, `—` where unknown."""
    flags = figures.window_flags
    share = figures.tail_share_of_net_energy
    ratio = figures.conservation_ratio
    drift_w = figures.idle_drift_w
    return [
        mark_estimate(format_value(figures.prefill_j_per_prompt_token), run),
        mark_estimate(format_value(figures.decode_j_per_output_token), run),
        "—" if share is None else f"{format_value(100 * share)} %",
        "—"
        if flags is None
        else (
            f"{flags.low_resolution} short · {flags.overlapped} overlapped · "
            f"{flags.large_tail} large tail"
        ),
        "—" if ratio is None else f"{ratio:#.3g}",  # 1.00, not 1: the ratio's precision shows
        "—" if drift_w is None else f"{drift_w:+.3g}",
    ]
