"""The `estimate:cpu` source: CPU power from utilisation and a TDP table, not a measurement.

It stands in only when no CPU package counter can be read, and is labelled "estimate" everywhere.
"""

import csv
import io
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, Protocol

import psutil

from openjarvis.power.sources import Discovery, EnergySource, unavailable

__all__ = [
    "CpuEstimate",
    "CpuPowerModel",
    "TdpRow",
    "busy_cpu_s",
    "cpu_model_name",
    "discover_estimate",
    "load_tdp_table",
    "power_model",
]


@dataclass(frozen=True, slots=True)
class TdpRow:
    """One row of data/cpu_tdp.csv (its header explains the power model)."""

    model_substring: str
    tdp_w: float
    cores: int
    threads: int
    idle_fraction: float
    source: str


@dataclass(frozen=True, slots=True)
class CpuPowerModel:
    """The TDP row chosen for this CPU, scaled to the logical CPUs this machine has."""

    cpu_model: str
    row: TdpRow
    logical_cpus: int

    @property
    def max_power_w(self) -> float:
        # A VM seeing 2 vCPUs of a 128-thread chip is charged 2/128 of the chip's TDP.
        return self.row.tdp_w * self.logical_cpus / self.row.threads

    @property
    def idle_power_w(self) -> float:
        return self.row.idle_fraction * self.max_power_w


def load_tdp_table() -> list[TdpRow]:
    """Read data/cpu_tdp.csv from the package, skipping its '#' comment lines."""
    text = (files("openjarvis") / "data" / "cpu_tdp.csv").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return [
        TdpRow(
            model_substring=row["model_substring"],
            tdp_w=float(row["tdp_w"]),
            cores=int(row["cores"]),
            threads=int(row["threads"]),
            idle_fraction=float(row["idle_fraction"]),
            source=row["source"],
        )
        for row in csv.DictReader(io.StringIO("\n".join(lines)))
    ]


def _normalise(model: str) -> str:
    without_marks = re.sub(r"\((r|tm)\)", "", model.lower())
    return " ".join(without_marks.split())


def cpu_model_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's marketing name as Linux reports it, else what the platform module knows.

    The one reader of the CPU's name: the estimate looks its TDP up by it, and host
    fingerprints hash it, so its fallbacks must not change."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    import platform  # only where /proc/cpuinfo says nothing

    return platform.processor() or platform.machine()


def power_model(cpu_model: str | None = None, logical_cpus: int | None = None) -> CpuPowerModel:
    """Pick the longest matching row of the TDP table; the '*' row when none matches."""
    model = cpu_model if cpu_model is not None else cpu_model_name()
    # psutil counts online CPUs, the same set /proc/stat sums over in cpu_times().
    cpus = logical_cpus if logical_cpus is not None else psutil.cpu_count(logical=True) or 1
    table = load_tdp_table()
    name = _normalise(model)
    matches = [row for row in table if _normalise(row.model_substring) in name]
    fallback = next(row for row in table if row.model_substring == "*")
    row = max(matches, key=lambda row: len(row.model_substring), default=fallback)
    return CpuPowerModel(cpu_model=model, row=row, logical_cpus=cpus)


class _CpuTimes(Protocol):
    """psutil's cpu_times() named tuple (its fields differ per platform)."""

    def _asdict(self) -> dict[str, Any]: ...


def busy_cpu_s(times: _CpuTimes) -> float:
    """CPU-seconds spent working, summed over CPUs, from a psutil cpu_times() tuple.

    Guest time is already inside user/nice on Linux; steal is time another tenant ran on the
    host's core, so it is not charged to this machine.
    """
    fields = times._asdict()
    not_busy = ("idle", "iowait", "steal", "guest", "guest_nice")
    return sum(value for key, value in fields.items() if key not in not_busy)


class CpuEstimate(EnergySource):
    """Cumulative modelled joules: P_idle * t + (P_max - P_idle) * busy CPU-seconds / CPUs.

    That is the integral of P = P_idle + (P_max - P_idle) * u, so windows need no sampler.
    """

    name = "estimate:cpu"
    domain = "cpu"
    method = "estimate"
    reads = "energy_j"
    # /proc/stat counts in clock ticks (USER_HZ, usually 100 per second).
    update_period_s = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
    sample_period_s = 0.5

    def __init__(self, model: CpuPowerModel, clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self._clock = clock

    def read(self) -> float:
        model = self.model
        busy_s = busy_cpu_s(psutil.cpu_times())
        dynamic_w = model.max_power_w - model.idle_power_w
        return model.idle_power_w * self._clock() + dynamic_w * busy_s / model.logical_cpus

    def describe(self) -> str:
        model, row = self.model, self.model.row
        return (
            f"{model.cpu_model} (TDP row {row.model_substring!r}): {row.tdp_w:g} W for "
            f"{row.threads} threads, scaled to {model.logical_cpus} CPUs: "
            f"{model.idle_power_w:.1f} W idle, "
            f"{model.max_power_w:.1f} W busy ({row.source})"
        )


def discover_estimate(
    cpu_counter_available: bool,
    clock: Callable[[], float] = time.monotonic,
    cpu_model: str | None = None,
) -> Discovery:
    """The estimate source, unless a CPU package counter already measures the CPU."""
    if cpu_counter_available:
        detail = "a CPU package counter measures the CPU; the estimate stands in only without one"
        status = unavailable("estimate:cpu", "cpu", "estimate", "superseded", detail)
        return Discovery((), (status,))
    return Discovery.of([CpuEstimate(power_model(cpu_model), clock)], [])
