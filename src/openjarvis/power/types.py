"""Plain data that crosses the power package's border: per-source energy and windows.

Units are in the names. Unknown figures are None with a reason, never 0.
"""

from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Domain",
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

# How a figure was obtained, strongest first (METRICS.md, "Energy provenance").
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
    return max(methods, key=lambda method: _METHOD_RANK[method])


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


@dataclass(frozen=True, slots=True)
class SourceEnergy:
    """One source's energy over one window."""

    source: str  # e.g. "nvml:GPU-<uuid>", "rapl:package-0", "estimate:cpu"
    domain: Domain
    method: Method
    energy_j: float | None
    net_energy_j: float | None
    idle_power_w: float | None
    null_reason: str | None = None
    low_resolution: bool = False


@dataclass(frozen=True, slots=True)
class WindowEnergy:
    """Energy of one labelled window over every source the meter owns.

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
