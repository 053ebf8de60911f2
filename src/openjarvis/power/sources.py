"""The small abstract energy source every vendor module implements, and its read error.

A source reads one thing (a counter's joules or a power reading's watts); the Meter does the rest.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from openjarvis.power.types import Coverage, Domain, Method, SourceStatus

__all__ = ["Discovery", "EnergySource", "ReadError", "ReadingKind", "unavailable"]

# What `read()` returns: a cumulative energy in joules (a counter, or a model that integrates
# itself) or an instantaneous power in watts that the Meter integrates over time.
ReadingKind = Literal["energy_j", "power_w"]


class ReadError(Exception):
    """A source could not be read. `reason` is a short code, `detail` one line with the fix.

    Vendor modules translate their library's and the kernel's errors into this where they
    enter, so the Meter only ever sees our own codes: permission, unsupported, no-device,
    read-error, vanished.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class EnergySource(ABC):
    """One energy or power reading: a GPU, a RAPL zone, the CPU estimate.

    Subclasses set the class or instance attributes below and implement `read()`.
    """

    name: str  # e.g. "nvml:GPU-<uuid>", "rapl:package-0", "estimate:cpu"
    domain: Domain
    method: Method
    reads: ReadingKind
    update_period_s: float  # how often the hardware refreshes the value
    sample_period_s: float  # how often the sampler should read it for traces and integration
    # A counter that wraps: its range in joules, and the longest gap between two reads that
    # cannot hide a wrap (range / a generous maximum power). None for counters that never wrap.
    wrap_j: float | None = None
    max_read_interval_s: float | None = None
    # A counter whose value steps at each refresh, a read returning the energy up to the last
    # one (NVML's, every ~100 ms): its refresh times are learned and windows are attributed
    # between them. False: the value is current when read (RAPL refreshes every ~1 ms).
    steps: bool = False
    # Cheap enough to read at every window's edges (a sysfs file, /proc/stat); an NVML call
    # costs milliseconds of the caller's time, so GPUs are read by the sampler only.
    edge_reads: bool = True

    @abstractmethod
    def read(self) -> float:
        """The counter's joules (wrapping at `wrap_j` if set) or the power in watts.

        Raises ReadError, never returns a made-up value.
        """

    def close(self) -> None:  # noqa: B027 - most sources hold nothing to release
        """Release what the source holds (an NVML handle); reading afterwards is an error."""

    @cached_property
    def status(self) -> SourceStatus:
        """Probe once by reading; later calls return the cached answer."""
        try:
            self.read()
        except ReadError as error:
            return SourceStatus(
                name=self.name,
                domain=self.domain,
                method=self.method,
                available=False,
                update_period_s=self.update_period_s,
                reason=error.reason,
                detail=error.detail,
            )
        return SourceStatus(
            name=self.name,
            domain=self.domain,
            method=self.method,
            available=True,
            update_period_s=self.update_period_s,
            detail=self.describe(),
        )

    def describe(self) -> str | None:
        """One line about the hardware behind the source (model, limits), if there is any."""
        return None


@dataclass(frozen=True, slots=True)
class Discovery:
    """What one vendor module found: readable sources, and a status for everything it looked at."""

    sources: tuple[EnergySource, ...]
    statuses: tuple[SourceStatus, ...]
    # Which of the looked-at sources a selection put in or out of scope, and which in scope
    # cannot be read; None where nothing was selected away (then scope alone decides).
    coverage: Coverage | None = None

    @classmethod
    def of(cls, candidates: list[EnergySource], extra: list[SourceStatus]) -> "Discovery":
        """Keep the candidates whose probe succeeds; close the others."""
        sources = []
        for candidate in candidates:
            if candidate.status.available:
                sources.append(candidate)
            else:
                candidate.close()
        statuses = [candidate.status for candidate in candidates] + extra
        return cls(sources=tuple(sources), statuses=tuple(statuses))


def unavailable(
    name: str, domain: Domain, method: Method, reason: str, detail: str
) -> SourceStatus:
    """The status of a source that could not even be built (no library, no device)."""
    return SourceStatus(
        name=name, domain=domain, method=method, available=False, reason=reason, detail=detail
    )
