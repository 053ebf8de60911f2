"""Whether the machine was quiet while a run measured it: CPU time other processes used
(psutil) and other processes on the metered GPUs (NVML), over the idle baseline and the tasks.

Energy counters read the whole device; another program's work lands in the run's joules and
its idle baseline. A run where that is material is marked `busy-machine` with this evidence.
"""

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field

import psutil

from openjarvis.power.estimate import CpuEstimate, busy_cpu_s
from openjarvis.power.sources import EnergySource, ReadError
from openjarvis.power.types import IdleBaseline

__all__ = [
    "IDLE_ABOVE_MODEL",
    "MATERIAL_OTHER_CORES",
    "Activity",
    "MachineCheck",
    "Watch",
    "check_machine",
    "idle_against_model",
    "watching",
]

# Other processes keeping this much of a core busy on average are material: on a laptop CPU a
# quarter core is watts, the size of a small model's whole draw.
MATERIAL_OTHER_CORES = 0.25
# An idle baseline this many times the CPU model's idle says something else was running then.
IDLE_ABOVE_MODEL = 1.5


@dataclass(frozen=True, slots=True)
class Activity:
    """What else the machine did over one stretch of a run (`idle`, or `tasks`)."""

    stretch: str
    seconds: float
    other_cpu_s: float | None  # CPU seconds of every process but this one and its children
    other_gpu_pids: tuple[int, ...] = ()  # processes on the metered GPUs, visible and not ours
    # Pids NVML lists that this process cannot see (another container's, or the host's view
    # of ours): reported, but not taken as evidence, since they may be this run itself.
    unseen_gpu_pids: tuple[int, ...] = ()
    null_reason: str | None = None  # why other_cpu_s is unknown

    @property
    def other_cores(self) -> float | None:
        """Other processes' mean busy cores over the stretch."""
        if self.other_cpu_s is None or self.seconds <= 0:
            return None
        return self.other_cpu_s / self.seconds

    def evidence(self) -> list[str]:
        """The material findings, in words; empty when the stretch was quiet."""
        found = []
        cores = self.other_cores
        if cores is not None and cores >= MATERIAL_OTHER_CORES:
            found.append(
                f"other processes kept {cores:.2f} cores busy during the {self.stretch} "
                f"({self.other_cpu_s:.1f} CPU-s over {self.seconds:.1f} s)"
            )
        if self.other_gpu_pids:
            pids = ", ".join(str(pid) for pid in self.other_gpu_pids)
            found.append(f"other processes on the metered GPUs during the {self.stretch}: {pids}")
        return found


@dataclass(frozen=True, slots=True)
class MachineCheck:
    """The run's stretches and whether any was material (`busy`), as the run stores it."""

    activities: tuple[Activity, ...] = ()
    idle_evidence: tuple[str, ...] = ()  # the idle baseline against the CPU model's idle
    evidence: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        found = [line for activity in self.activities for line in activity.evidence()]
        object.__setattr__(self, "evidence", (*found, *self.idle_evidence))

    @property
    def busy(self) -> bool:
        return bool(self.evidence)

    def to_dict(self) -> dict[str, object]:
        return {
            "busy": self.busy,
            "evidence": list(self.evidence),
            "stretches": [asdict(activity) for activity in self.activities],
        }


def _own_cpu_s() -> float:
    """CPU seconds of this process, its finished children (the sandbox's test runs) and its
    live descendants (a GPU engine's core process and its ranks), with theirs that finished."""
    me = psutil.Process()
    times = me.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in me.children(recursive=True):
        with suppress(psutil.Error):  # it ended meanwhile: its time is its parent's now
            times = child.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def _own_pids() -> set[int]:
    me = psutil.Process()
    return {me.pid, *(child.pid for child in me.children(recursive=True))}


def _gpu_pids(gpus: Sequence[EnergySource]) -> set[int]:
    pids: set[int] = set()
    for gpu in gpus:
        process_ids = getattr(gpu, "process_ids", None)
        if process_ids is None:  # not an NVML source: no way to list its processes
            continue
        try:
            pids.update(process_ids())
        except ReadError:  # unsupported on this GPU or driver: nothing to list
            continue
    return pids


@dataclass(slots=True)
class Watch:
    """A stretch being watched; `activity` is set when it ends."""

    stretch: str
    gpus: Sequence[EnergySource]
    clock: Callable[[], float]
    start_s: float = 0.0
    machine_cpu_s: float = 0.0
    own_cpu_s: float = 0.0
    gpu_pids: set[int] = field(default_factory=set)
    activity: Activity | None = None

    def start(self) -> None:
        self.gpu_pids = _gpu_pids(self.gpus)
        self.start_s = self.clock()
        self.machine_cpu_s = busy_cpu_s(psutil.cpu_times())
        self.own_cpu_s = _own_cpu_s()

    def stop(self) -> Activity:
        """End the stretch (once: a later call returns what the first found)."""
        if self.activity is not None:
            return self.activity
        seconds = self.clock() - self.start_s
        machine_cpu_s = busy_cpu_s(psutil.cpu_times()) - self.machine_cpu_s
        own_cpu_s = _own_cpu_s() - self.own_cpu_s
        # The two counters tick at different instants: a quiet machine can read a hair below
        # zero, which is no CPU time of others.
        other_cpu_s = max(0.0, machine_cpu_s - own_cpu_s)
        pids = self.gpu_pids | _gpu_pids(self.gpus)
        own = _own_pids()
        visible = {pid for pid in pids if psutil.pid_exists(pid)}
        self.activity = Activity(
            stretch=self.stretch,
            seconds=seconds,
            other_cpu_s=other_cpu_s,
            other_gpu_pids=tuple(sorted(visible - own)),
            unseen_gpu_pids=tuple(sorted(pids - visible)),
        )
        return self.activity


@contextmanager
def watching(
    stretch: str, gpus: Sequence[EnergySource], clock: Callable[[], float] = time.monotonic
) -> Iterator[Watch]:
    """Watch what else the machine does while the block runs; the watch's `activity` holds
    it afterwards (also when the block raised, for what was seen until then)."""
    watch = Watch(stretch, gpus, clock)
    watch.start()
    try:
        yield watch
    finally:
        watch.stop()


def idle_against_model(
    idle: IdleBaseline | None, sources: Sequence[EnergySource]
) -> tuple[str, ...]:
    """The idle baseline of each modelled CPU source against the model's own idle power: a
    baseline well above it was measured while something else ran."""
    if idle is None:
        return ()
    found = []
    for source in sources:
        if not isinstance(source, CpuEstimate):
            continue
        measured_w = idle.power_w.get(source.name)
        model_w = source.model.idle_power_w
        if measured_w is not None and measured_w > IDLE_ABOVE_MODEL * model_w:
            found.append(
                f"idle baseline of {source.name} {measured_w:.3g} W against the model's "
                f"{model_w:.3g} W idle"
            )
    return tuple(found)


def check_machine(
    activities: Sequence[Activity | None],
    idle: IdleBaseline | None,
    sources: Sequence[EnergySource],
) -> MachineCheck:
    """The run's machine check from its watched stretches (None: not watched)."""
    return MachineCheck(
        tuple(a for a in activities if a is not None), idle_against_model(idle, sources)
    )
