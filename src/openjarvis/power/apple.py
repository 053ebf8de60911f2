"""Apple Silicon through zeus-apple-silicon (IOReport, no sudo): CPU, GPU and DRAM energy.

`zeus_apple_silicon` is imported here and nowhere else; its errors are translated here. Not
run on a Mac by this project yet: built and tested against the library's documented API.
"""

import platform
import sys
import threading
from typing import Any

from openjarvis.power.sources import Discovery, EnergySource, ReadError, unavailable
from openjarvis.power.types import Coverage, Domain

__all__ = ["APPLE_FIELDS", "AppleEnergy", "discover_apple"]

# AppleEnergyMetrics fields read as sources (millijoules since the monitor started; None where
# the chip does not report one). The Neural Engine (ane_mj) is left out: no domain holds it,
# and the engines here do not use it.
APPLE_FIELDS: dict[str, Domain] = {"cpu_total_mj": "cpu", "gpu_mj": "gpu", "dram_mj": "dram"}


class _Monitor:
    """One AppleEnergyMonitor shared by the sources of a discovery; reads are serialised."""

    def __init__(self, monitor: Any) -> None:
        self._monitor = monitor
        self._lock = threading.Lock()

    def cumulative(self) -> Any:
        with self._lock:
            try:
                return self._monitor.get_cumulative_energy()
            except RuntimeError as error:  # what the bindings raise when IOReport fails
                raise ReadError(
                    "read-error", f"IOReport stopped answering ({error}); restart the run"
                ) from error


class AppleEnergy(EnergySource):
    """One field of IOReport's energy (CPU, GPU or DRAM) as a cumulative counter in joules."""

    method = "counter"
    reads = "energy_j"
    # IOReport computes the energy when sampled; its own refresh period is not documented and
    # was not measured here (no Mac): 10 ms is an assumption that only sets low_resolution.
    update_period_s = 0.01
    sample_period_s = 0.1
    edge_reads = False  # an IOReport sample per read: the sampler's cost, not the caller's

    def __init__(self, monitor: _Monitor, field: str, domain: Domain, chip: str) -> None:
        self._monitor = monitor
        self.field = field
        self.domain = domain
        self.chip = chip
        self.name = f"apple:{domain}"

    def read(self) -> float:
        value = getattr(self._monitor.cumulative(), self.field, None)
        if value is None:
            raise ReadError("unsupported", f"this chip reports no {self.field} through IOReport")
        return int(value) / 1000.0

    def describe(self) -> str:
        return f"{self.chip}, IOReport {self.field.removesuffix('_mj')} energy"


def _import_zeus_apple_silicon() -> Any:
    try:
        import zeus_apple_silicon
    except ImportError:
        return None
    return zeus_apple_silicon


def discover_apple() -> Discovery:
    """The CPU, GPU and DRAM energy of an Apple Silicon Mac, probed; elsewhere a status that
    says so (and, without the library on a Mac, how to install it)."""
    library = _import_zeus_apple_silicon()
    if library is None:
        on_mac = sys.platform == "darwin" and platform.machine() == "arm64"
        detail = (
            "zeus-apple-silicon is missing: `pip install zeus-apple-silicon` (the apple extra)"
            if on_mac
            else "not an Apple Silicon Mac (zeus-apple-silicon reads IOReport on macOS)"
        )
        reason = "unsupported" if on_mac else "no-device"
        status = unavailable("apple", "gpu", "counter", reason, detail)
        return Discovery(
            (), (status,), Coverage(("apple",), (), {"apple": reason}) if on_mac else Coverage()
        )
    try:
        monitor = _Monitor(library.AppleEnergyMonitor())
    except RuntimeError as error:
        detail = f"zeus-apple-silicon could not open IOReport ({error}); check macOS 12 or later"
        status = unavailable("apple", "gpu", "counter", "unsupported", detail)
        return Discovery((), (status,), Coverage(("apple",), (), {"apple": "unsupported"}))
    chip = platform.processor() or platform.machine()
    try:
        reported = monitor.cumulative()
    except ReadError as error:
        status = unavailable("apple", "gpu", "counter", error.reason, error.detail)
        return Discovery((), (status,), Coverage(("apple",), (), {"apple": error.reason}))
    # A field the chip does not report is no source at all (not a missing one).
    candidates: list[EnergySource] = [
        AppleEnergy(monitor, field, domain, chip)
        for field, domain in APPLE_FIELDS.items()
        if getattr(reported, field, None) is not None
    ]
    return Discovery.of(candidates, [])
