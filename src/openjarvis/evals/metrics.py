"""The one place a run's figures are computed, for the CLI, the store and reports.

Ratios come with 95 % percentile bootstrap intervals over tasks (2,000 resamples, fixed seed).
"""

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from openjarvis.evals.scoring import pass_at_k
from openjarvis.store.records import TaskResultRecord

__all__ = [
    "COMPARED_FIGURES",
    "LARGE_TAIL_SHARE",
    "Comparison",
    "Estimate",
    "RunFigures",
    "TaskFigures",
    "compare_figures",
    "compute_figures",
    "phase_energy",
    "sum_or_none",
    "task_figures",
    "window_flags",
]

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261130
CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class TaskFigures:
    """What metrics need of one task (the symbols of the formulas below in comments)."""

    samples: int  # n
    passed: int  # c
    latency_s: float  # tau_i
    energy_j: float | None  # E_i
    net_energy_j: float | None  # E_i_net
    completion_tokens: int  # tok_out_i, summed over samples
    ttft_s: float | None = None
    decode_tokens_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class Estimate:
    """A figure with its 95 % bootstrap interval; all None (with a reason) when undefined."""

    value: float | None
    low: float | None = None
    high: float | None = None
    null_reason: str | None = None


@dataclass(frozen=True, slots=True)
class RunFigures:
    tasks: int
    samples: int
    accuracy: Estimate
    pass_at_k: dict[int, Estimate]
    mean_energy_j: Estimate
    mean_net_energy_j: Estimate
    mean_power_w: Estimate
    accuracy_per_joule: Estimate
    accuracy_per_joule_net: Estimate
    accuracy_per_watt: Estimate
    accuracy_per_watt_net: Estimate
    joules_per_solved_task: Estimate
    joules_per_solved_task_net: Estimate
    joules_per_output_token: Estimate
    joules_per_output_token_net: Estimate
    latency_p50_s: float | None
    latency_p95_s: float | None
    ttft_p50_s: float | None
    decode_tokens_per_s: float | None
    extra: dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


Statistic = Callable[[np.ndarray], np.ndarray]  # resampled index rows -> one value per row


def _estimate(statistic: Statistic, n_tasks: int, reason: str | None = None) -> Estimate:
    """Point value on all tasks plus the percentile interval over bootstrap resamples."""
    return _bootstrap(statistic, (n_tasks,), reason)


def _mean_over_rows(values: np.ndarray) -> Statistic:
    """The statistic that averages per-task `values` over each resample's tasks."""
    return lambda rows: values[rows].mean(1)


def _bootstrap(
    statistic: Callable[..., np.ndarray], sizes: tuple[int, ...], reason: str | None = None
) -> Estimate:
    """`_estimate` over one or more independent task sets; statistic takes one row set each."""
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


def _with_baseline_error(
    mean_net: Estimate, idle_error_w: float | None, mean_tau_s: float
) -> Estimate:
    """Widen mean net energy's interval by the idle baseline's own error (95 %, two-sided)."""
    if idle_error_w is None or mean_net.low is None or mean_net.high is None:
        return mean_net
    spread_j = 1.96 * idle_error_w * mean_tau_s
    return replace(mean_net, low=mean_net.low - spread_j, high=mean_net.high + spread_j)


def _net_resolved(mean_net: Estimate) -> bool:
    """Whether net energy is known to be above 0: a ratio over it means something."""
    if mean_net.value is None or mean_net.value <= 0:
        return False
    return mean_net.low is None or mean_net.low > 0


def _percentile(values: Sequence[float | None], q: float) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.percentile(known, q)) if known else None


def compute_figures(tasks: Sequence[TaskFigures], idle_error_w: float | None = None) -> RunFigures:
    """All run figures from per-task figures.

    `idle_error_w`: the uncertainty of the idle baseline summed over the scope (W). Every
    task's net energy shares that error (times its duration), which resampling tasks cannot
    see, so it widens the interval of mean net energy. Net ratios are null (`net-unresolved`)
    where mean net energy is not above 0 or its widened interval reaches 0.
    """
    n_tasks = len(tasks)
    if n_tasks == 0:
        raise ValueError("no tasks to compute figures from")
    samples = min(t.samples for t in tasks)
    accuracy = np.array([t.passed / t.samples for t in tasks])
    tau = np.array([t.latency_s for t in tasks])
    tokens = np.array([t.completion_tokens for t in tasks], dtype=float)

    def gross_or_net(net: bool) -> tuple[np.ndarray, str | None]:
        values = [t.net_energy_j if net else t.energy_j for t in tasks]
        if any(v is None for v in values):
            return np.zeros(n_tasks), "energy-unknown"
        return np.array(values, dtype=float), None

    energy, energy_reason = gross_or_net(net=False)
    net_energy, net_reason = gross_or_net(net=True)

    def energy_figures(e: np.ndarray, reason: str | None) -> list[Estimate]:
        power = e / tau  # P_i
        return [
            _estimate(lambda r: e[r].mean(1), n_tasks, reason),
            _estimate(lambda r: accuracy[r].mean(1) / e[r].mean(1), n_tasks, reason),
            _estimate(lambda r: accuracy[r].mean(1) / power[r].mean(1), n_tasks, reason),
            _estimate(lambda r: e[r].mean(1) / accuracy[r].mean(1), n_tasks, reason),
            _estimate(lambda r: e[r].sum(1) / tokens[r].sum(1), n_tasks, reason),
        ]

    mean_e, apj, apw, per_solved, per_token = energy_figures(energy, energy_reason)
    mean_net, apj_net, apw_net, per_solved_net, per_token_net = energy_figures(
        net_energy, net_reason
    )
    mean_net = _with_baseline_error(mean_net, idle_error_w, float(tau.mean()))
    if net_reason is None and not _net_resolved(mean_net):
        unresolved = Estimate(None, null_reason="net-unresolved")
        apj_net = apw_net = per_solved_net = per_token_net = unresolved
    pass_k = {}
    for k in range(1, samples + 1):
        per_task = np.array([pass_at_k(t.samples, t.passed, k) for t in tasks])
        pass_k[k] = _estimate(_mean_over_rows(per_task), n_tasks)
    return RunFigures(
        tasks=n_tasks,
        samples=samples,
        accuracy=_estimate(lambda r: accuracy[r].mean(1), n_tasks),
        pass_at_k=pass_k,
        mean_energy_j=mean_e,
        mean_net_energy_j=mean_net,
        mean_power_w=_estimate(lambda r: (energy / tau)[r].mean(1), n_tasks, energy_reason),
        accuracy_per_joule=apj,
        accuracy_per_joule_net=apj_net,
        accuracy_per_watt=apw,
        accuracy_per_watt_net=apw_net,
        joules_per_solved_task=per_solved,
        joules_per_solved_task_net=per_solved_net,
        joules_per_output_token=per_token,
        joules_per_output_token_net=per_token_net,
        latency_p50_s=_percentile(tau.tolist(), 50),
        latency_p95_s=_percentile(tau.tolist(), 95),
        ttft_p50_s=_percentile([t.ttft_s for t in tasks], 50),
        decode_tokens_per_s=_percentile([t.decode_tokens_per_s for t in tasks], 50),
    )


# Figures `compare_figures` gives ratios of: name -> (energy it needs, statistic of one run).
# "energy" / "net_energy" name the TaskFigures column; None needs no energy.
_ColumnStatistic = Callable[[dict[str, np.ndarray], np.ndarray], np.ndarray]
COMPARED_FIGURES: dict[str, tuple[str | None, _ColumnStatistic]] = {
    "accuracy": (None, lambda c, r: c["accuracy"][r].mean(1)),
    "mean_energy_j": ("energy", lambda c, r: c["energy"][r].mean(1)),
    "mean_net_energy_j": ("net_energy", lambda c, r: c["net_energy"][r].mean(1)),
    "mean_power_w": ("energy", lambda c, r: (c["energy"] / c["tau"])[r].mean(1)),
    "accuracy_per_joule": (
        "energy",
        lambda c, r: c["accuracy"][r].mean(1) / c["energy"][r].mean(1),
    ),
    "accuracy_per_joule_net": (
        "net_energy",
        lambda c, r: c["accuracy"][r].mean(1) / c["net_energy"][r].mean(1),
    ),
    "accuracy_per_watt": (
        "energy",
        lambda c, r: c["accuracy"][r].mean(1) / (c["energy"] / c["tau"])[r].mean(1),
    ),
    "joules_per_output_token": (
        "energy",
        lambda c, r: c["energy"][r].sum(1) / c["tokens"][r].sum(1),
    ),
}


@dataclass(frozen=True, slots=True)
class Comparison:
    """Ratios `other / baseline` of COMPARED_FIGURES with 95 % bootstrap intervals."""

    paired: bool  # resampled over shared task ids (same task sets), else each run on its own
    baseline_tasks: int
    other_tasks: int
    ratios: dict[str, Estimate]


def _columns(tasks: Sequence[TaskFigures]) -> dict[str, np.ndarray]:
    """Per-task arrays; an energy column is absent when any task's energy is unknown."""
    columns = {
        "accuracy": np.array([t.passed / t.samples for t in tasks]),
        "tau": np.array([t.latency_s for t in tasks]),
        "tokens": np.array([t.completion_tokens for t in tasks], dtype=float),
    }
    for name, values in (
        ("energy", [t.energy_j for t in tasks]),
        ("net_energy", [t.net_energy_j for t in tasks]),
    ):
        if all(v is not None for v in values):
            columns[name] = np.array(values, dtype=float)
    return columns


def compare_figures(
    baseline: Mapping[str, TaskFigures], other: Mapping[str, TaskFigures]
) -> Comparison:
    """Ratios of two runs' figures, keyed by task id: paired when both ran the same tasks."""
    if not baseline or not other:
        raise ValueError("both runs need at least one task to compare")
    paired = baseline.keys() == other.keys()
    # Paired: both runs' arrays in the same task order, so one row set resamples both at once.
    order_a = sorted(baseline)
    order_b = order_a if paired else sorted(other)
    columns_a = _columns([baseline[task_id] for task_id in order_a])
    columns_b = _columns([other[task_id] for task_id in order_b])
    ratios: dict[str, Estimate] = {}
    for name, (needs, statistic) in COMPARED_FIGURES.items():
        reason = None
        if needs is not None and (needs not in columns_a or needs not in columns_b):
            reason = "energy-unknown"
        if paired:
            ratios[name] = _bootstrap(
                lambda r, s=statistic: s(columns_b, r) / s(columns_a, r), (len(order_a),), reason
            )
        else:
            ratios[name] = _bootstrap(
                lambda ra, rb, s=statistic: s(columns_b, rb) / s(columns_a, ra),
                (len(order_a), len(order_b)),
                reason,
            )
    return Comparison(paired, len(order_a), len(order_b), ratios)


def task_figures(record: TaskResultRecord) -> TaskFigures:
    """What metrics need of a stored task."""
    return TaskFigures(
        samples=record.samples,
        passed=record.passed,
        latency_s=record.latency_s,
        energy_j=record.energy_j,
        net_energy_j=record.net_energy_j,
        completion_tokens=record.completion_tokens,
        ttft_s=record.ttft_s,
        decode_tokens_per_s=record.decode_tokens_per_s,
    )


# A tail above this share of a task's net energy is flagged: most of what the task is charged
# came after it returned (a device slow to wind down, or load from something else).
LARGE_TAIL_SHARE = 0.25


def window_flags(records: Sequence[TaskResultRecord]) -> dict[str, int]:
    """How many tasks had windows short for the counters, overlapping others, or a large tail.

    A task that overlapped others on an engine that said what work each did has its share by
    that work (`shared`), so only overlaps split by time are counted."""
    large_tail = 0
    for record in records:
        tail_j, net_j = record.tail_energy_j, record.net_energy_j
        large_tail += (
            tail_j is not None
            and net_j is not None
            and net_j > 0
            and (tail_j > LARGE_TAIL_SHARE * net_j)
        )
    return {
        "tasks": len(records),
        "low_resolution": sum(any(e.low_resolution for e in r.energy) for r in records),
        "overlapped": sum(r.overlapped and not r.shared for r in records),
        "large_tail": large_tail,
    }


def sum_or_none(values: Sequence[float | None]) -> float | None:
    """The sum, or None when any part is unknown (or there are no parts)."""
    if not values or None in values:
        return None
    return sum(v for v in values if v is not None)


def phase_energy(records: Sequence[TaskResultRecord]) -> dict[str, float | None]:
    """Prefill energy per prompt token and decode energy per output token over the run's
    tasks (energy split at each sample's first token), and the tails' share of net energy;
    None when any part is unknown."""
    prefill_j = sum_or_none([r.prefill_energy_j for r in records])
    decode_j = sum_or_none([r.decode_energy_j for r in records])
    tails_j = sum_or_none([r.tail_energy_j for r in records])
    net_j = sum_or_none([r.net_energy_j for r in records])
    prompt_tokens = sum(r.prompt_tokens for r in records)
    output_tokens = sum(r.completion_tokens for r in records)
    return {
        "tail_share_of_net_energy": (
            tails_j / net_j if tails_j is not None and net_j is not None and net_j > 0 else None
        ),
        "prefill_j_per_prompt_token": (
            prefill_j / prompt_tokens if prefill_j is not None and prompt_tokens else None
        ),
        "decode_j_per_output_token": (
            decode_j / output_tokens if decode_j is not None and output_tokens else None
        ),
    }
