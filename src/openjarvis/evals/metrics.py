"""The one place the figures of METRICS.md are computed, for the CLI, the store and reports.

Ratios come with 95 % percentile bootstrap intervals over tasks (2,000 resamples, fixed seed).
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from openjarvis.evals.scoring import pass_at_k

__all__ = ["Estimate", "RunFigures", "TaskFigures", "compute_figures"]

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261130
CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class TaskFigures:
    """What metrics need of one task (METRICS.md symbols in comments)."""

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
    if reason is not None:
        return Estimate(None, null_reason=reason)
    with np.errstate(divide="ignore", invalid="ignore"):
        point = float(statistic(np.arange(n_tasks)[None, :])[0])
        rng = np.random.default_rng(BOOTSTRAP_SEED)
        rows = rng.integers(0, n_tasks, size=(BOOTSTRAP_RESAMPLES, n_tasks))
        values = statistic(rows)
    if not math.isfinite(point):
        return Estimate(None, null_reason="undefined")
    # Resamples where the ratio is undefined (no task solved) carry no information about it.
    values = values[np.isfinite(values)]
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return Estimate(point, float(low), float(high))


def _percentile(values: Sequence[float | None], q: float) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.percentile(known, q)) if known else None


def compute_figures(tasks: Sequence[TaskFigures]) -> RunFigures:
    """All run figures of METRICS.md from per-task figures."""
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
    pass_k = {}
    for k in range(1, samples + 1):
        per_task = np.array([pass_at_k(t.samples, t.passed, k) for t in tasks])
        pass_k[k] = _estimate(lambda r, p=per_task: p[r].mean(1), n_tasks)
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
