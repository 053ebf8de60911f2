"""How a run's stored figures read in a terminal: intervals, concurrency, phase energy and the
windows' checks, worded alike by `ipw show`, `ipw compare`, `ipw evals` and measure's summary.
"""

from collections.abc import Mapping

from openjarvis.metrics import NONE_PASSED, Estimate
from openjarvis.report.runs import format_interval, format_value

__all__ = [
    "concurrency_rows",
    "interval_text",
    "output_token_text",
    "prompt_token_text",
    "windows_text",
]


def interval_text(estimate: Estimate) -> str:
    """An estimate as every `ipw` table shows it: `value [low, high]`, `—` when unknown, and a
    ratio over a run that passed nothing as `0 (none passed)` (no interval bounds it)."""
    if estimate.null_reason == NONE_PASSED and estimate.value is not None:
        return f"{format_value(estimate.value)} (none passed)"
    return format_interval(estimate.value, estimate.low, estimate.high)


def concurrency_rows(figures: object) -> list[tuple[str, str]]:
    """The rows of a run measured with tasks in flight at once: how many, how many tasks
    shared the engine at what mean batch, and the exact J per task (the union of this
    process's windows over its tasks); none for a run of one task at a time. Takes the dict
    `ipw measure` stores in a run's summary ("concurrency")."""
    if not isinstance(figures, dict) or not figures.get("concurrency", 1) > 1:
        return []

    def number(key: str) -> float | None:
        value = figures.get(key)
        return float(value) if isinstance(value, int | float) else None

    shared = (
        f"{figures.get('concurrency')} · {figures.get('shared_tasks')} tasks shared the engine"
        f" · mean batch {format_value(number('mean_batch'), 2)}"
    )
    union = (
        f"{format_value(number('joules_per_task'))} · net "
        f"{format_value(number('net_joules_per_task'))} "
        f"(union of the windows of {figures.get('union_tasks')} tasks)"
    )
    return [("tasks in flight", shared), ("J per task, exact · net", union)]


def output_token_text(estimate: Estimate, phase: Mapping[str, float | None]) -> str:
    """The one `J per output token` row: all the energy over the output tokens with its
    interval, and the decode part alone (from the first token on) from `phase_energy`'s dict."""
    decode = format_value(phase.get("decode_j_per_output_token"))
    return f"{interval_text(estimate)} (decode alone {decode})"


def prompt_token_text(phase: Mapping[str, float | None]) -> str:
    """Prefill J per prompt token (start to first token), from `phase_energy`'s dict."""
    return format_value(phase.get("prefill_j_per_prompt_token"))


def windows_text(flags: object, conservation: object, *, always_ratio: bool) -> str | None:
    """The tasks whose energy deserves a second look, the samples that could not be scored,
    and whether the windows added up to the
    counters (always, or only when off by more than 1 %); None when there is nothing to say.
    Takes the dicts `ipw measure` stores in a run's summary ("windows", "conservation"); with
    tasks in flight at once, the windows' energies are the tasks' shares of the union."""
    parts = []
    if isinstance(flags, dict):
        for key, text in (
            ("low_resolution", "shorter than 10 counter refreshes"),
            ("overlapped", "overlapped other windows"),
            ("large_tail", "with over a quarter of their net energy in the tail"),
        ):
            if flags.get(key):
                parts.append(f"{flags[key]} of {flags.get('tasks', '?')} tasks {text}")
        if flags.get("scoring_errors"):
            parts.append(
                f"{flags['scoring_errors']} of {flags.get('samples', '?')} samples could not be "
                "scored (a judge gave no verdict, or the tests could not run): they count as not "
                "passed, so accuracy is a lower bound"
            )
    ratio = conservation.get("ratio") if isinstance(conservation, dict) else None
    if isinstance(ratio, float) and (always_ratio or abs(ratio - 1) > 0.01):
        parts.append(
            f"the tasks' net energies (their shares, where they shared the engine) add up to "
            f"{ratio:.4f} of the counters over the union of their windows"
        )
    return "; ".join(parts) or None
