"""Every interval OpenJarvis prints: Wilson score intervals for pass rates, one seeded percentile
bootstrap over tasks for means and ratios, and the small-n caution built from the actual counts.

`ipw measure`, `show`, `compare` and the report all take their intervals from here, so one run
shows one interval wherever it appears (docs/report.md, "Uncertainty").
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "BOOTSTRAP_SEED",
    "CONFIDENCE",
    "SMALL_N_TASKS",
    "Estimate",
    "bootstrap",
    "proportion",
    "small_n_caution",
    "wilson",
]

CONFIDENCE = 0.95
Z_95 = 1.959964  # two-sided 95 % normal quantile
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261130
# Below this many tasks a pass rate's interval is wider than about +-17 points at 50 %: every
# figure that rests on so few says so.
SMALL_N_TASKS = 30


@dataclass(frozen=True, slots=True)
class Estimate:
    """A figure with its 95 % interval; the value None (with a reason) when undefined, the
    bounds None when no interval can be given (the reason then says why, if there is one)."""

    value: float | None
    low: float | None = None
    high: float | None = None
    null_reason: str | None = None


def wilson(successes: float, trials: int) -> tuple[float, float] | None:
    """The 95 % Wilson score interval of a pass rate; None without trials.

    Honest at the edges where a bootstrap is not: 0 of 3 is [0, 0.56], never [0, 0].
    `successes` may be fractional (a mean of per-task rates times the number of tasks).
    """
    if trials <= 0:
        return None
    if not 0 <= successes <= trials:
        raise ValueError(f"{successes} passed of {trials} trials")
    rate = successes / trials
    z2 = Z_95 * Z_95
    denominator = 1 + z2 / trials
    centre = (rate + z2 / (2 * trials)) / denominator
    half = Z_95 * math.sqrt(rate * (1 - rate) / trials + z2 / (4 * trials * trials)) / denominator
    # The interval holds the rate; rounding can leave 1 of 1 a hair outside its upper end.
    return min(rate, max(0.0, centre - half)), max(rate, min(1.0, centre + half))


def proportion(successes: float, trials: int) -> Estimate:
    """A pass rate with its Wilson interval."""
    interval = wilson(successes, trials)
    if interval is None:
        return Estimate(None, null_reason="no-trials")
    return Estimate(successes / trials, interval[0], interval[1])


Statistic = Callable[..., np.ndarray]  # one array of resampled row indices per task set


def bootstrap(statistic: Statistic, sizes: tuple[int, ...], reason: str | None = None) -> Estimate:
    """The statistic on all tasks, with its 95 % percentile interval over BOOTSTRAP_RESAMPLES
    resamples of each task set (with replacement, seeded: the same tasks give the same
    interval). `statistic` takes one (rows, tasks) index array per task set and returns one
    value per row. `reason` short-circuits to an unknown figure."""
    if reason is not None:
        return Estimate(None, null_reason=reason)
    with np.errstate(divide="ignore", invalid="ignore"):
        point = float(statistic(*(np.arange(n)[None, :] for n in sizes))[0])
        rng = np.random.default_rng(BOOTSTRAP_SEED)
        rows = [rng.integers(0, n, size=(BOOTSTRAP_RESAMPLES, n)) for n in sizes]
        values = statistic(*rows)
    if not math.isfinite(point):
        return Estimate(None, null_reason="undefined")
    # Resamples where the ratio is undefined (no task solved) carry no information about it.
    values = values[np.isfinite(values)]
    if values.size == 0:
        return Estimate(point, null_reason="no-interval")
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return Estimate(point, float(low), float(high))


def small_n_caution(tasks: int, counts: Sequence[tuple[int, int]]) -> str | None:
    """One sentence when `tasks` are too few for the figures to be read as settled, with each
    run's own pass count and its interval (`counts`: passed, trials per run); None from
    SMALL_N_TASKS tasks on."""
    if tasks >= SMALL_N_TASKS:
        return None
    spans = []
    for passed, trials in counts:
        interval = wilson(passed, trials)
        if interval is not None:
            spans.append(
                f"{passed} of {trials} passed: {interval[0]:.0%} to {interval[1]:.0%} at 95 %"
            )
    detail = f" ({'; '.join(spans)})" if spans else ""
    plural = "s" if tasks != 1 else ""
    return f"small n, {tasks} task{plural}{detail}; read differences as tentative"
