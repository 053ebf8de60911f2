"""What a measured run's energy rests on, apart from generating and scoring: which GPUs it
meters, its claim on the sources, idle power after the tasks and the baseline's error, whether
the windows add up (conservation), the run's exact energy per task when tasks shared the
engine, and the notes that say what the figures are.
"""

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace

from openjarvis.engine_kinds import LOCAL_ENGINE_KINDS
from openjarvis.errors import UserError
from openjarvis.metrics import sum_or_none
from openjarvis.power import Meter, quiet
from openjarvis.power.claims import Claim
from openjarvis.power.sources import EnergySource
from openjarvis.power.types import (
    GpuSelection,
    IdleBaseline,
    Scope,
    SourceEnergy,
    TotalEnergy,
    WindowEnergy,
)
from openjarvis.records import RunRecord, TaskResultRecord
from openjarvis.runtime.cloud import measured_here
from openjarvis.runtime.types import Completion, Engine

__all__ = [
    "busy_note",
    "check_same_gpus",
    "claimed",
    "concurrency_figures",
    "conservation",
    "energy_method",
    "energy_note",
    "estimated_window",
    "gpu_description",
    "idle_after",
    "idle_error_w",
    "machine_check",
    "metered_gpus",
    "metering",
    "refuse_empty_scope",
    "shared_note",
    "watching_machine",
]


def idle_after(idle_seconds: float, meter: Meter, engine: Engine) -> IdleBaseline | None:
    """Idle power again once the tasks are done, to report how far it drifted."""
    if idle_seconds <= 0 or not measured_here(engine) or meter.idle is None:
        return None
    return meter.measure_idle(idle_seconds, use=False)


def idle_error_w(meter: Meter, after: IdleBaseline | None) -> float | None:
    """The idle baseline's uncertainty over the sources in scope, in watts: each source's
    standard error and half its drift over the run, added in quadrature. None: unknown."""
    if meter.idle is None:
        return None
    variance = 0.0
    for source in meter.scoped_sources:
        error_w = meter.idle.error_w.get(source.name)
        if error_w is None:
            return None
        drift_w = 0.0
        before_w = meter.idle.power_w.get(source.name)
        after_w = after.power_w.get(source.name) if after is not None else None
        if before_w is not None and after_w is not None:
            drift_w = 0.5 * (after_w - before_w)
        variance += error_w**2 + drift_w**2
    return math.sqrt(variance)


def conservation(
    total: TotalEnergy, saved: list[TaskResultRecord], engine: Engine
) -> dict[str, float | None]:
    """This process's windows against the counters over the same time (`Meter.total()`, the
    union of its windows and tails; docs/energy.md): the tasks' net energies, or their shares
    where they ran at once, add up to the union's within rounding when no joule is lost."""
    if not measured_here(engine):
        return {"windows_net_j": None, "bracket_net_j": None, "ratio": None}
    windows_j = sum_or_none([r.net_energy_j for r in saved])
    bracket_j = total.net_energy_j
    ratio = None if windows_j is None or not bracket_j else windows_j / bracket_j
    return {"windows_net_j": windows_j, "bracket_net_j": bracket_j, "ratio": ratio}


def concurrency_figures(
    total: TotalEnergy,
    saved: list[TaskResultRecord],
    results: list[TaskResultRecord],
    engine: Engine,
    concurrency: int,
) -> dict[str, object]:
    """Tasks in flight at once, how many of the run's tasks shared their energy and at what
    mean batch (weighted by each task's time), and the run's exact energy per task: the union
    of this process's windows (`saved`, its tasks) over their number, gross and net. Each
    task's own figure is its attributed share; the shares add up to the union (conservation).
    """
    batches = [(r.mean_batch, r.latency_s) for r in results if r.mean_batch is not None]
    seconds = sum(latency_s for _, latency_s in batches)
    measured = measured_here(engine) and bool(saved)
    gross_j = total.windows_energy_j if measured else None
    net_j = total.net_energy_j if measured else None
    return {
        "concurrency": concurrency,
        "shared_tasks": sum(r.shared for r in results),
        "mean_batch": (
            sum(batch * latency_s for batch, latency_s in batches) / seconds
            if batches and seconds > 0
            else None
        ),
        "union_tasks": len(saved),
        "union_energy_j": gross_j,
        "union_net_energy_j": net_j,
        # The time inside at least one window: the union's energy over it is the machine's
        # mean power while it worked (metrics.UnionEnergy).
        "union_seconds": total.windows_s if measured else None,
        "joules_per_task": None if gross_j is None else gross_j / len(saved),
        "net_joules_per_task": None if net_j is None else net_j / len(saved),
    }


def estimated_window(window: WindowEnergy, completion: Completion) -> WindowEnergy:
    """A cloud completion's energy is its token-based estimate (data/cloud_energy.csv),
    not what this machine drew meanwhile; idle subtraction does not apply to it (net unknown).
    Neither does the window's split at the first token or its tail (this machine's draw over
    time): prefill and decode are the estimate's own parts, by input and output tokens."""
    estimate = completion.energy_estimate
    if estimate is None:
        return window
    source = SourceEnergy(
        source=estimate.source,
        domain="cloud",
        method="estimate",
        energy_j=estimate.energy_j,
        net_energy_j=None,
        idle_power_w=None,
    )
    return replace(
        window,
        method="estimate",
        energy_j=estimate.energy_j,
        net_energy_j=None,
        null_reason=None,
        sources=(source,),
        low_resolution=False,
        tail_energy_j=None,
        prefill_energy_j=estimate.prefill_energy_j,
        decode_energy_j=(
            None
            if estimate.prefill_energy_j is None
            else estimate.energy_j - estimate.prefill_energy_j
        ),
    )


def metered_gpus(gpus: str, engine: Engine) -> GpuSelection:
    """The GPUs whose energy the run counts: the engine's own (docs/energy.md), or `--gpus all`.
    A server on this machine does not say which GPUs it runs on: every visible one counts."""
    if gpus == "all" or (measured_here(engine) and engine.kind not in LOCAL_ENGINE_KINDS):
        return "all"
    return engine.devices


def check_same_gpus(run: RunRecord, coverage: dict[str, object]) -> None:
    """A resumed run meters the GPUs it started with: CUDA_VISIBLE_DEVICES may map the engine's
    devices to other boards in a new shell."""
    if not run.energy_coverage:
        return  # stored before runs kept their coverage

    def gpus(coverage: dict[str, object]) -> list[str]:
        names = coverage.get("in_scope")
        return [n for n in names if str(n).startswith("nvml:")] if isinstance(names, list) else []

    before, now = gpus(run.energy_coverage), gpus(coverage)
    if sorted(before) != sorted(now):
        raise UserError(
            f"run {run.id} metered {', '.join(before) or 'no GPU'} but this process would meter "
            f"{', '.join(now) or 'no GPU'}; set CUDA_VISIBLE_DEVICES as when the run started"
        )


def gpu_description(source: EnergySource) -> str:
    """ "NVIDIA H200 (GPU-<uuid>)": the product for people, the uuid for the host fingerprint."""
    name = getattr(source, "gpu_name", "GPU")
    return f"{name} ({source.name.removeprefix('nvml:')})"


def energy_method(meter: Meter, engine: Engine) -> str | None:
    return meter.method if measured_here(engine) else "estimate"


def energy_note(meter: Meter, engine: Engine, results: list[TaskResultRecord]) -> str | None:
    """Why energy is estimated, missing, or unknown for some tasks; None when all is measured."""
    notes = []
    if not measured_here(engine):
        notes.append(
            "energy is an estimate from token counts and data/cloud_energy.csv "
            "(energy per token, PUE), not a measurement"
        )
    elif meter.method == "estimate":
        notes.append(
            "energy is an estimate from CPU utilisation and a TDP model, not a measurement"
        )
    if engine.kind not in LOCAL_ENGINE_KINDS and measured_here(engine):
        notes.append(local_server_note(engine))
    unknown = Counter(r.energy_null_reason or "unknown" for r in results if r.energy_j is None)
    if unknown and meter.method is not None:
        reasons = ", ".join(f"{count} {reason}" for reason, count in unknown.most_common())
        notes.append(
            f"energy unknown for {sum(unknown.values())} of {len(results)} tasks ({reasons}), "
            "so the run's energy figures are null"
        )
    return "; ".join(notes) or None


def local_server_note(engine: Engine) -> str:
    """What a run of a server on this machine measured, and how its tokens were counted."""
    settings = engine.settings_dict()
    note = (
        f"the server at {settings.get('base_url')} runs on this machine and was metered with its "
        "sources in scope (every visible GPU: the server does not say which it uses); requests "
        "that overlapped split each interval by time, since a foreign server reports no engine "
        "steps"
    )
    counted = getattr(engine, "counted_completions", 0)
    if counted:
        note += (
            f"; the server sent no token usage with {counted} replies, so their tokens were "
            f"counted with {getattr(engine, 'tokenizer_path', None)} (replies re-tokenized)"
        )
    return note


@contextmanager
def metering(
    engine: Engine, scope: Scope, gpus: str, allow_shared: bool, holder: str
) -> Iterator[tuple[Meter, dict[str, str]]]:
    """A started meter over the engine's sources in `scope`, with its claim on them; yields the
    meter and the sources another measurement holds (see `claimed`)."""
    with Meter.discover(scope=scope, gpus=metered_gpus(gpus, engine)) as meter:
        refuse_empty_scope(meter, engine)
        with claimed(meter, engine, allow_shared, holder) as shared_with:
            yield meter, shared_with


def refuse_empty_scope(meter: Meter, engine: Engine) -> None:
    """A local run whose scope holds no source would measure nothing: refuse it before it
    starts, saying what the scope left out and what to pass instead."""
    if not measured_here(engine) or meter.coverage.in_scope:
        return
    left_out = meter.coverage.out_of_scope
    if left_out:
        why = f"the engine runs on no GPU (visible but out of scope: {', '.join(left_out)})"
        fix = f"--scope system, or --gpus all to meter {'it' if len(left_out) == 1 else 'them'}"
    else:
        why, fix = "no GPU can be read here", "--scope system"
    raise UserError(
        f"--scope {meter.scope} holds no energy source: {why}, so every energy figure would be "
        f"null; measure with {fix}"
    )


@contextmanager
def claimed(
    meter: Meter, engine: Engine, allow_shared: bool, holder: str
) -> Iterator[dict[str, str]]:
    """Claim the sources in scope for this run (power/claims.py); yields those another
    measurement holds, which only `allow_shared` accepts."""
    # A cloud run's energy is an estimate: this machine's draw is not its figure.
    claim = meter.claim(holder) if measured_here(engine) else Claim()
    try:
        if claim.shared and not allow_shared:
            name, holder = next(iter(claim.taken.items()))
            raise UserError(
                f"another measurement holds {name} ({holder}): both would claim its joules; "
                "wait for it to finish, or pass --allow-shared to measure anyway (the run is "
                "then marked shared-machine)"
            )
        yield claim.taken
    finally:
        claim.release()


def shared_note(run: RunRecord, note: str | None) -> str | None:
    """Say so when another measurement held a source of this run's scope (shared-machine)."""
    shared = run.options.get("shared_machine")
    if not shared:
        return note
    names = ", ".join(str(name) for name in shared) if isinstance(shared, list) else str(shared)
    line = (
        f"shared-machine: another measurement held {names} during this run; both claim those "
        "joules, so this run's energy figures are too high by the other's share"
    )
    return line if note is None else f"{note}; {line}"


def watching_machine(stretch: str, meter: Meter) -> AbstractContextManager[quiet.Watch]:
    """Watch what else the machine does during a stretch of the run (`idle`, `tasks`): other
    processes' CPU time, and other processes on the GPUs the meter reads (power/quiet.py)."""
    return quiet.watching(stretch, [s for s in meter.sources if s.domain == "gpu"])


def busy_note(check: quiet.MachineCheck, note: str | None) -> str | None:
    """Say so when the run was measured on a busy machine, with the evidence."""
    if not check.busy:
        return note
    line = (
        "busy-machine: " + "; ".join(check.evidence) + ". Their draw is in this run's energy "
        "figures and its idle baseline; measure again on a quiet machine before comparing"
    )
    return line if note is None else f"{note}; {line}"


def machine_check(watches: Sequence[quiet.Watch | None], meter: Meter) -> quiet.MachineCheck:
    """What else the machine did while the run's stretches were watched (idle, tasks), against
    the idle baseline: the summary's `machine`."""
    activities = [watch.activity for watch in watches if watch is not None]
    return quiet.check_machine(activities, meter.idle, meter.scoped_sources)
