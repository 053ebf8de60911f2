"""Plain data that crosses the power package's border: per-source energy and windows.

Units are in the names. Unknown figures are None with a reason, never 0.
"""

from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Coverage",
    "Domain",
    "GpuSelection",
    "IdleBaseline",
    "Method",
    "PowerSample",
    "Scope",
    "SourceEnergy",
    "SourceStatus",
    "TotalEnergy",
    "WindowEnergy",
    "weakest_method",
]

# How a figure was obtained, strongest first (the README's "Reading the energy figures").
Method = Literal["counter", "integrated", "estimate"]
# What a source covers: a GPU, a CPU package, DRAM, the whole platform (RAPL psys), or a
# remote data centre (a cloud model's per-token estimate; no local meter reads it).
Domain = Literal["gpu", "cpu", "dram", "platform", "cloud"]
# A run's energy scope: GPUs only, or GPUs + CPU packages + DRAM.
Scope = Literal["accelerator", "system"]

_METHOD_RANK: dict[str, int] = {"counter": 0, "integrated": 1, "estimate": 2}


def weakest_method(methods: list[Method]) -> Method | None:
    """The run's method is the weakest of its sources' methods."""
    if not methods:
        return None
    return max(methods, key=_METHOD_RANK.__getitem__)


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """What `ipw power` lists: a source that can be read, or why not and how to fix it."""

    name: str
    domain: Domain
    method: Method
    available: bool
    update_period_s: float | None = None
    reason: str | None = None  # short code: permission, unsupported, no-device, ...
    detail: str | None = None  # one line for a person: what happened and how to fix it


# Not frozen, as ScopeSum: the accountant makes one of each for every window it publishes, and a
# frozen dataclass's __init__ takes 2.5 times as long (its share of the accountant's CPU under
# load was ~7 %). Read-only all the same: nothing changes one once made.
@dataclass(slots=True)
class SourceEnergy:
    """One source's energy over one window (read-only)."""

    source: str  # e.g. "nvml:GPU-<uuid>", "rapl:package-0", "estimate:cpu"
    domain: Domain
    method: Method
    energy_j: float | None
    net_energy_j: float | None
    idle_power_w: float | None
    null_reason: str | None = None
    low_resolution: bool = False
    tail_j: float | None = None  # above idle after the window (inside energy_j); None: open
    prefill_j: float | None = None  # window start to first token, when the caller marked it
    shared: bool = False  # split with overlapping windows by the work each did (docs/energy.md)


@dataclass(slots=True)  # not frozen: see SourceEnergy
class WindowEnergy:
    """Energy of one labelled window over every source the meter owns (read-only).

    `energy_j` sums the sources inside `scope` (psys is never in a sum). It is None,
    with `null_reason`, when any source in scope could not be read.
    """

    label: str
    start_s: float  # time.monotonic()
    end_s: float
    scope: Scope
    method: Method | None
    energy_j: float | None
    net_energy_j: float | None
    null_reason: str | None
    sources: tuple[SourceEnergy, ...]
    low_resolution: bool = False
    overlapped: bool = False
    # Another window overlapped this one and their intervals were split by the work each did
    # (a batching engine's steps); `mean_batch` is the time-weighted batch size of its steps
    # (None: the engine reported no steps).
    shared: bool = False
    mean_batch: float | None = None
    # Energy above idle between this window and the next (the device winding down), already
    # inside energy_j and net_energy_j; None while the next window has not opened (or no idle).
    tail_energy_j: float | None = None
    prefill_energy_j: float | None = None  # start to first token (when the caller marked it)
    decode_energy_j: float | None = None  # first token to the end, with the tail

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def mean_power_w(self) -> float | None:
        if self.energy_j is None or self.duration_s <= 0:
            return None
        return self.energy_j / self.duration_s


@dataclass(frozen=True, slots=True)
class TotalEnergy:
    """Energy over the union of a meter's closed windows: overlapping windows count once.

    Each source's energy is read at the edges of the union's intervals; `covered_s` is the
    time inside at least one window, and the idle subtraction uses it.
    """

    scope: Scope
    method: Method | None
    covered_s: float
    windows: int
    energy_j: float | None
    net_energy_j: float | None
    null_reason: str | None
    sources: tuple[SourceEnergy, ...]
    # The time inside at least one window (tails left out), and the energy as the windows
    # count it: above idle over windows and tails, idle over the windows' time only. The
    # windows' gross energies add up to it (docs/energy.md, "Shared energy").
    windows_s: float = 0.0
    windows_energy_j: float | None = None


@dataclass(frozen=True, slots=True)
class PowerSample:
    """One point of a power trace: mean watts of a source since its previous sample."""

    source: str
    time_s: float  # time.monotonic()
    power_w: float


@dataclass(slots=True)
class IdleBaseline:
    """Idle power per source, measured before a run."""

    seconds: float
    power_w: dict[str, float | None] = field(default_factory=dict)
    # Standard error of each mean (from the spread of its refresh intervals); None: unknown.
    error_w: dict[str, float | None] = field(default_factory=dict)


# Which GPUs a meter reads: CUDA device indices as the engine's process sees them (positions in
# CUDA_VISIBLE_DEVICES), or every visible GPU.
GpuSelection = tuple[int, ...] | Literal["all"]


@dataclass(frozen=True, slots=True)
class Coverage:
    """What a meter's scope covers (docs/energy.md): the sources in it, the
    visible GPUs left out because the engine does not run on them, and the sources in scope that
    cannot be read, with the reason. A missing source makes the scope partial.

    Sources outside the scope's domains (CPU and DRAM under `accelerator`, psys always) follow
    from the scope's name and are not listed.
    """

    in_scope: tuple[str, ...] = ()  # source names, the missing ones included
    out_of_scope: tuple[str, ...] = ()  # visible GPUs the engine does not use: never read
    missing: dict[str, str] = field(default_factory=dict)  # name -> permission, unsupported, ...

    @property
    def partial(self) -> bool:
        return bool(self.missing)

    def to_dict(self) -> dict[str, object]:
        """As runs store it: {"in_scope": [...], "out_of_scope": [...], "missing": {...}}."""
        return {
            "in_scope": list(self.in_scope),
            "out_of_scope": list(self.out_of_scope),
            "missing": dict(self.missing),
        }
