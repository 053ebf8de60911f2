"""The one place a run's figures are computed, for the CLI, the store and reports: a leaf that
reads records only, so that the evals, the report and the commands share it.

Intervals come from intervals.py: Wilson for pass rates, a seeded percentile bootstrap
over tasks for means and ratios. Power is the machine's over the union of the run's windows.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from openjarvis.intervals import Estimate, bootstrap, proportion
from openjarvis.records import RunRecord, TaskResultRecord

__all__ = [
    "ACCURACY_RATIOS",
    "COMPARED_FIGURES",
    "LARGE_TAIL_SHARE",
    "NONE_PASSED",
    "Comparison",
    "Estimate",
    "RunFigures",
    "TaskFigures",
    "UnionEnergy",
    "compare_figures",
    "compute_figures",
    "pass_at_k",
    "phase_energy",
    "run_figures",
    "sum_or_none",
    "task_figures",
    "union_energy",
    "window_flags",
]


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
    # Its windows overlapped others' (shared by work, or split by time): tau_i is then not
    # the task's own time on the machine, and E_i / tau_i is no power of anything.
    overlapped: bool = False


@dataclass(frozen=True, slots=True)
class UnionEnergy:
    """The run's energy over the union of its windows (a joule counted once, tails included)
    and the time inside at least one window: the machine's power while it worked is their
    ratio, whatever ran at once. `ipw measure` stores it in the summary's `concurrency`."""

    energy_j: float | None
    net_energy_j: float | None
    seconds: float

    def power_w(self, net: bool) -> float | None:
        energy_j = self.net_energy_j if net else self.energy_j
        return energy_j / self.seconds if energy_j is not None and self.seconds > 0 else None


def union_energy(concurrency: object) -> UnionEnergy | None:
    """The union a run stored (its summary's `concurrency` dict); None for runs stored before
    the union's time was kept, or without energy."""
    if not isinstance(concurrency, Mapping):
        return None
    seconds = concurrency.get("union_seconds")
    gross, net = concurrency.get("union_energy_j"), concurrency.get("union_net_energy_j")
    if not isinstance(seconds, int | float) or seconds <= 0:
        return None
    return UnionEnergy(
        float(gross) if isinstance(gross, int | float) else None,
        float(net) if isinstance(net, int | float) else None,
        float(seconds),
    )


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
    passed: int = 0  # samples passed over all tasks
    trials: int = 0  # samples over all tasks
    extra: dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


# Ratios with accuracy on top: a run that passed nothing has 0 in every resample, and an
# interval of [0, 0] would claim a certainty that 0 passes lack, so they carry no interval
# and say why (`none-passed`); the accuracy's Wilson interval says how sure the 0 is.
ACCURACY_RATIOS = (
    "accuracy_per_joule",
    "accuracy_per_joule_net",
    "accuracy_per_watt",
    "accuracy_per_watt_net",
)
NONE_PASSED = "none-passed"


def _estimate(
    statistic: Callable[[np.ndarray], np.ndarray], n_tasks: int, reason: str | None = None
) -> Estimate:
    """The statistic over one task set, with its bootstrap interval."""
    return bootstrap(statistic, (n_tasks,), reason)


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


def _accuracy(tasks: Sequence[TaskFigures]) -> Estimate:
    """pass@1 with its Wilson interval: over every sample where tasks were sampled alike (the
    mean of per-task rates is then the pooled rate), else over tasks."""
    if len({t.samples for t in tasks}) == 1:
        return proportion(sum(t.passed for t in tasks), sum(t.samples for t in tasks))
    return proportion(sum(t.passed / t.samples for t in tasks), len(tasks))


def _power(
    tasks: Sequence[TaskFigures], union: UnionEnergy | None, net: bool
) -> tuple[float | None, Estimate]:
    """The machine's mean power while it worked: the union's energy over its time where the run
    stored it (no interval: one measurement, not a mean over tasks), else the tasks' energy
    over their time where no two tasks overlapped (their windows are then the union), with its
    bootstrap interval. Unknown where tasks overlapped and the union was not kept."""
    if union is not None:
        power_w = union.power_w(net)
        if power_w is None:
            return None, Estimate(None, null_reason="energy-unknown")
        return power_w, Estimate(power_w)
    if any(t.overlapped for t in tasks):
        return None, Estimate(None, null_reason="union-unknown")
    values = [t.net_energy_j if net else t.energy_j for t in tasks]
    if None in values:
        return None, Estimate(None, null_reason="energy-unknown")
    energy = np.array(values, dtype=float)
    tau = np.array([t.latency_s for t in tasks])
    return None, _estimate(lambda r: energy[r].sum(1) / tau[r].sum(1), len(tasks))


def _per_watt(
    tasks: Sequence[TaskFigures], accuracy: Estimate, union: UnionEnergy | None, net: bool
) -> Estimate:
    """Accuracy over the machine's power: the Wilson interval of accuracy over a measured union
    power, else the bootstrap of the ratio over tasks."""
    power_w, power = _power(tasks, union, net)
    if power.value is None:
        return Estimate(None, null_reason=power.null_reason)
    if power_w is not None:
        if power_w <= 0 or accuracy.value is None:
            return Estimate(None, null_reason="undefined")
        low = None if accuracy.low is None else accuracy.low / power_w
        high = None if accuracy.high is None else accuracy.high / power_w
        return Estimate(accuracy.value / power_w, low, high)
    energy = np.array([t.net_energy_j if net else t.energy_j for t in tasks], dtype=float)
    tau = np.array([t.latency_s for t in tasks])
    rates = np.array([t.passed / t.samples for t in tasks])
    return _estimate(lambda r: rates[r].mean(1) / (energy[r].sum(1) / tau[r].sum(1)), len(tasks))


def compute_figures(
    tasks: Sequence[TaskFigures],
    idle_error_w: float | None = None,
    union: UnionEnergy | None = None,
) -> RunFigures:
    """All run figures from per-task figures.

    `idle_error_w`: the uncertainty of the idle baseline summed over the scope (W). Every
    task's net energy shares that error (times its duration), which resampling tasks cannot
    see, so it widens the interval of mean net energy. Net ratios are null (`net-unresolved`)
    where mean net energy is not above 0 or its widened interval reaches 0.
    `union`: the run's energy over the union of its windows, which mean power and accuracy per
    watt rest on (the machine's power, not a task's share of it).
    """
    n_tasks = len(tasks)
    if n_tasks == 0:
        raise ValueError("no tasks to compute figures from")
    samples = min(t.samples for t in tasks)
    rates = np.array([t.passed / t.samples for t in tasks])
    tokens = np.array([t.completion_tokens for t in tasks], dtype=float)
    accuracy = _accuracy(tasks)
    none_passed = all(t.passed == 0 for t in tasks)

    def gross_or_net(net: bool) -> tuple[np.ndarray, str | None]:
        values = [t.net_energy_j if net else t.energy_j for t in tasks]
        if any(v is None for v in values):
            return np.zeros(n_tasks), "energy-unknown"
        return np.array(values, dtype=float), None

    energy, energy_reason = gross_or_net(net=False)
    net_energy, net_reason = gross_or_net(net=True)

    def energy_figures(e: np.ndarray, reason: str | None, net: bool) -> list[Estimate]:
        per_joule = _estimate(lambda r: rates[r].mean(1) / e[r].mean(1), n_tasks, reason)
        per_watt = _per_watt(tasks, accuracy, union, net) if reason is None else per_joule
        if none_passed:
            per_joule, per_watt = (
                Estimate(0.0, null_reason=NONE_PASSED) if f.value is not None else f
                for f in (per_joule, per_watt)
            )
        return [
            _estimate(lambda r: e[r].mean(1), n_tasks, reason),
            per_joule,
            per_watt,
            _estimate(lambda r: e[r].mean(1) / rates[r].mean(1), n_tasks, reason),
            _estimate(lambda r: e[r].sum(1) / tokens[r].sum(1), n_tasks, reason),
        ]

    mean_e, apj, apw, per_solved, per_token = energy_figures(energy, energy_reason, net=False)
    mean_net, apj_net, apw_net, per_solved_net, per_token_net = energy_figures(
        net_energy, net_reason, net=True
    )
    tau = np.array([t.latency_s for t in tasks])
    mean_net = _with_baseline_error(mean_net, idle_error_w, float(tau.mean()))
    if net_reason is None and not _net_resolved(mean_net):
        unresolved = Estimate(None, null_reason="net-unresolved")
        apj_net = apw_net = per_solved_net = per_token_net = unresolved
    pass_k = {1: accuracy}
    for k in range(2, samples + 1):
        per_task = [pass_at_k(t.samples, t.passed, k) for t in tasks]
        pass_k[k] = proportion(sum(per_task), n_tasks)
    return RunFigures(
        tasks=n_tasks,
        samples=samples,
        accuracy=accuracy,
        pass_at_k=pass_k,
        mean_energy_j=mean_e,
        mean_net_energy_j=mean_net,
        mean_power_w=(
            _power(tasks, union, net=False)[1]
            if energy_reason is None
            else Estimate(None, null_reason=energy_reason)
        ),
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
        passed=sum(t.passed for t in tasks),
        trials=sum(t.samples for t in tasks),
    )


def _power_rows(c: dict[str, np.ndarray], r: np.ndarray) -> np.ndarray:
    """The machine's mean power in each resample: the union's, which resampling tasks does not
    change, or the resampled tasks' energy over their time (no two of them overlapped)."""
    if "union_power" in c:
        return np.full(r.shape[0], float(c["union_power"]))
    return c["energy"][r].sum(1) / c["tau"][r].sum(1)


# Figures `compare_figures` gives ratios of: name -> (column it needs, statistic of one run).
# "energy" / "net_energy" name the TaskFigures column, "power" a known machine power; None
# needs nothing beyond accuracy.
_ColumnStatistic = Callable[[dict[str, np.ndarray], np.ndarray], np.ndarray]
COMPARED_FIGURES: dict[str, tuple[str | None, _ColumnStatistic]] = {
    "accuracy": (None, lambda c, r: c["accuracy"][r].mean(1)),
    "mean_energy_j": ("energy", lambda c, r: c["energy"][r].mean(1)),
    "mean_net_energy_j": ("net_energy", lambda c, r: c["net_energy"][r].mean(1)),
    "mean_power_w": ("power", _power_rows),
    "accuracy_per_joule": (
        "energy",
        lambda c, r: c["accuracy"][r].mean(1) / c["energy"][r].mean(1),
    ),
    "accuracy_per_joule_net": (
        "net_energy",
        lambda c, r: c["accuracy"][r].mean(1) / c["net_energy"][r].mean(1),
    ),
    "accuracy_per_watt": (
        "power",
        lambda c, r: c["accuracy"][r].mean(1) / _power_rows(c, r),
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


def _columns(tasks: Sequence[TaskFigures], union: UnionEnergy | None) -> dict[str, np.ndarray]:
    """Per-task arrays; an energy column is absent when any task's energy is unknown, and the
    `power` marker when the machine's power is (tasks overlapped and no union was kept)."""
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
    union_power_w = union.power_w(net=False) if union is not None else None
    if union_power_w is not None:
        columns["union_power"] = columns["power"] = np.array(union_power_w)
    elif union is None and "energy" in columns and not any(t.overlapped for t in tasks):
        columns["power"] = np.array(1.0)
    return columns


def compare_figures(
    baseline: Mapping[str, TaskFigures],
    other: Mapping[str, TaskFigures],
    unions: tuple[UnionEnergy | None, UnionEnergy | None] = (None, None),
) -> Comparison:
    """Ratios of two runs' figures, keyed by task id: paired when both ran the same tasks.
    `unions`: each run's energy over the union of its windows (see compute_figures)."""
    if not baseline or not other:
        raise ValueError("both runs need at least one task to compare")
    paired = baseline.keys() == other.keys()
    # Paired: both runs' arrays in the same task order, so one row set resamples both at once.
    order_a = sorted(baseline)
    order_b = order_a if paired else sorted(other)
    columns_a = _columns([baseline[task_id] for task_id in order_a], unions[0])
    columns_b = _columns([other[task_id] for task_id in order_b], unions[1])
    ratios: dict[str, Estimate] = {}
    for name, (needs, statistic) in COMPARED_FIGURES.items():
        reason = None
        if needs is not None and (needs not in columns_a or needs not in columns_b):
            reason = "union-unknown" if needs == "power" else "energy-unknown"
        if name == "mean_power_w" and "union_power" in columns_a and "union_power" in columns_b:
            # Two single measurements: resampling tasks cannot move them, and an interval of
            # one point would claim a certainty nobody measured.
            power_a, power_b = float(columns_a["union_power"]), float(columns_b["union_power"])
            ratios[name] = Estimate(power_b / power_a) if power_a > 0 else Estimate(None)
            continue
        if paired:
            ratios[name] = bootstrap(
                lambda r, s=statistic: s(columns_b, r) / s(columns_a, r), (len(order_a),), reason
            )
        else:
            ratios[name] = bootstrap(
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
        overlapped=record.overlapped or record.shared,
    )


def run_figures(run: RunRecord, tasks: Sequence[TaskResultRecord]) -> RunFigures:
    """A stored run's figures over `tasks` as `ipw measure` computed them: with the idle
    baseline's error and the union of the windows it recorded. `ipw show`, `ipw compare` and
    the report all call this, so one run shows the same figures everywhere. Power is a rate:
    the run's union gives the machine's power for any subset of its tasks too."""
    summary = run.summary or {}
    idle_error_w = summary.get("idle_error_w")
    return compute_figures(
        [task_figures(task) for task in tasks],
        idle_error_w=float(idle_error_w) if isinstance(idle_error_w, int | float) else None,
        union=union_energy(summary.get("concurrency")),
    )


# A tail above this share of a task's net energy is flagged: most of what the task is charged
# came after it returned (a device slow to wind down, or load from something else).
LARGE_TAIL_SHARE = 0.25


def window_flags(records: Sequence[TaskResultRecord]) -> dict[str, int]:
    """How many tasks had windows short for the counters, overlapping others, or a large tail,
    and how many samples could not be scored (`scoring_errors`: a judge that gave no verdict,
    a test run that could not start) of all `samples`: they count as not passed, and the
    summary says how many.

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
        "samples": sum(r.samples for r in records),
        "scoring_errors": sum(status == "error" for r in records for status in r.statuses),
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


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c passed: 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the huge binomials.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0  # every choice of k samples contains a passing one
    failure = 1.0
    for i in range(n - c + 1, n + 1):
        failure *= 1.0 - k / i
    return 1.0 - failure
