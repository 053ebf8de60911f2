"""Where a run's joules go: the idle floor against the net draw, by domain (GPU, CPU, DRAM),
estimated parts apart, with mean and idle power, memory-bandwidth use and the prefill/decode
split, so that "this GPU is mostly idle at batch 1" shows at a glance (docs/report.md).
"""

from collections.abc import Sequence
from dataclasses import dataclass

from openjarvis.metrics import union_energy
from openjarvis.report.accounting import Accounting
from openjarvis.report.runs import coverage_names, figure, is_cloud, is_estimate, mean_if_known
from openjarvis.store import RunRecord, TaskResultRecord

__all__ = ["DOMAIN_ORDER", "Breakdown", "DomainPart", "breakdown", "breakdown_sentence"]

DOMAIN_ORDER = ("gpu", "cpu", "dram", "platform", "cloud")
# Above this share of the gross energy the report says the run mostly paid for idle power.
MOSTLY_IDLE_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class DomainPart:
    """One domain's mean net joules per task (above idle) and whether it was estimated."""

    domain: str
    net_j: float
    estimated: bool


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Mean joules per task of one run, split; None where the run did not record the part."""

    label: str
    hardware: str
    tasks: int | None
    gross_j: float | None
    idle_floor_j: float | None  # idle power x task time, summed over the sources in scope
    parts: tuple[DomainPart, ...]  # net by domain, in DOMAIN_ORDER; empty without readings
    mean_power_w: float | None
    idle_power_w: float | None  # summed over the sources in scope, measured before the run
    memory_bandwidth_use: float | None  # decode's share of the device's measured bandwidth
    prefill_j: float | None  # mean per task, window start to first token
    decode_j: float | None  # the rest, tail included
    tail_share: float | None  # of net energy
    low_resolution_share: float | None  # of tasks
    negative_net_tasks: int | None  # tasks whose net energy came out below 0
    out_of_scope: tuple[str, ...]  # sources read or traced but not in the run's total
    estimated: bool  # the run's energy method is `estimate` (some or all of it)
    cloud: bool  # a remote API: no idle floor applies, its energy is a per-token estimate

    @property
    def idle_share(self) -> float | None:
        if self.gross_j is None or self.idle_floor_j is None or self.gross_j <= 0:
            return None
        return self.idle_floor_j / self.gross_j


def _idle_power_w(run: RunRecord) -> float | None:
    names = coverage_names(run.energy_coverage, "in_scope") or list(run.idle_power_w)
    readings = [run.idle_power_w.get(name) for name in names]
    if not readings or any(reading is None for reading in readings):
        return None
    return sum(reading for reading in readings if reading is not None)


def _parts(run: RunRecord, tasks: Sequence[TaskResultRecord]) -> tuple[DomainPart, ...]:
    """Net joules per task by domain, over the sources in scope (all of a task's readings when
    the run recorded no scope); empty when a task has no readings or an unknown one."""
    in_scope = set(coverage_names(run.energy_coverage, "in_scope"))
    totals: dict[str, float] = {}
    estimated: dict[str, bool] = {}
    for task in tasks:
        readings = [e for e in task.energy if not in_scope or e.source in in_scope]
        if not readings:
            return ()
        for reading in readings:
            if reading.net_energy_j is None:
                return ()
            totals[reading.domain] = totals.get(reading.domain, 0.0) + reading.net_energy_j
            estimated[reading.domain] = estimated.get(reading.domain, False) or (
                reading.method == "estimate"
            )
    order = sorted(totals, key=lambda d: DOMAIN_ORDER.index(d) if d in DOMAIN_ORDER else 99)
    return tuple(DomainPart(d, totals[d] / len(tasks), estimated[d]) for d in order)


def _out_of_scope(run: RunRecord, tasks: Sequence[TaskResultRecord]) -> tuple[str, ...]:
    in_scope = set(coverage_names(run.energy_coverage, "in_scope"))
    if not in_scope:
        return ()
    read = {e.source for task in tasks for e in task.energy} | set(run.idle_power_w)
    return tuple(sorted(read - in_scope))


def breakdown(
    run: RunRecord,
    tasks: Sequence[TaskResultRecord],
    figures: Accounting,
    label: str,
    hardware: str,
) -> Breakdown:
    """The split of a run's mean joules per task, from its saved tasks (figures the summary
    alone cannot give are None without them)."""
    gross = mean_if_known([t.energy_j for t in tasks]) if tasks else figure(run, "mean_energy_j")[0]
    net = (
        mean_if_known([t.net_energy_j for t in tasks])
        if tasks
        else figure(run, "mean_net_energy_j")[0]
    )
    idle_floor = gross - net if gross is not None and net is not None else None
    flags = figures.window_flags
    low_resolution = flags.low_resolution / flags.tasks if flags and flags.tasks else None
    summary = run.summary or {}
    mbu = summary.get("memory_bandwidth_utilisation")
    return Breakdown(
        label=label,
        hardware=hardware,
        tasks=len(tasks)
        if tasks
        else (stored if isinstance(stored := summary.get("tasks"), int) else None),
        gross_j=gross,
        idle_floor_j=idle_floor,
        parts=_parts(run, tasks) if tasks else (),
        mean_power_w=_machine_power_w(run),
        idle_power_w=_idle_power_w(run),
        memory_bandwidth_use=float(mbu) if isinstance(mbu, int | float) else None,
        prefill_j=mean_if_known([t.prefill_energy_j for t in tasks]) if tasks else None,
        decode_j=mean_if_known([t.decode_energy_j for t in tasks]) if tasks else None,
        tail_share=figures.tail_share_of_net_energy,
        low_resolution_share=low_resolution,
        negative_net_tasks=(
            sum(t.net_energy_j is not None and t.net_energy_j < 0 for t in tasks) if tasks else None
        ),
        out_of_scope=_out_of_scope(run, tasks),
        estimated=is_estimate(run),
        cloud=is_cloud(run),
    )


def _machine_power_w(run: RunRecord) -> float | None:
    """The machine's mean power while the run worked: over the union of its windows where the
    run stored it, else its stored figure (runs measured one task at a time, or earlier)."""
    union = union_energy((run.summary or {}).get("concurrency"))
    power_w = union.power_w(net=False) if union is not None else None
    return power_w if power_w is not None else figure(run, "mean_power_w")[0]


def breakdown_sentence(split: Breakdown) -> str:
    """The one line a reader needs first: how much of each task's energy is the idle floor."""
    share = split.idle_share
    if split.cloud and split.gross_j is not None:
        return (
            f"{split.label}: an estimate of {split.gross_j:.3g} J per task from tokens; no idle "
            "floor applies (nobody here reads the provider's machines)."
        )
    if share is None or split.gross_j is None:
        return f"{split.label}: the idle floor is unknown (no net energy recorded)."
    power = ""
    if split.idle_power_w is not None and split.mean_power_w is not None:
        power = f" ({split.idle_power_w:.3g} W idle against {split.mean_power_w:.3g} W mean)"
    text = f"{split.label}: {share:.0%} of {split.gross_j:.3g} J per task is the idle floor{power}"
    if share > MOSTLY_IDLE_SHARE:
        text += ": the hardware is mostly idle at this load"
    if split.memory_bandwidth_use is not None:
        text += f"; decode used {split.memory_bandwidth_use:.1%} of memory bandwidth"
    return text + "."
