"""Which energy sources a meter reads: the GPUs the engine runs on (or every visible one), CPU
packages and DRAM, and the labelled CPU estimate where no CPU counter can be read.
"""

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from openjarvis.power.accounting import in_scope
from openjarvis.power.estimate import discover_estimate
from openjarvis.power.nvml import discover_nvml
from openjarvis.power.rapl import discover_rapl
from openjarvis.power.sources import Discovery, EnergySource
from openjarvis.power.types import Coverage, GpuSelection, Scope, SourceStatus

__all__ = ["Found", "discover_sources"]


@dataclass(frozen=True, slots=True)
class Found:
    sources: tuple[EnergySource, ...]  # readable
    statuses: tuple[SourceStatus, ...]  # every source looked at, readable or not
    coverage: Coverage  # what `scope` covers: in it, GPUs left out, and missing sources


def discover_sources(
    sysfs_root: str | Path | None = None,
    *,
    gpus: GpuSelection = "all",
    scope: Scope = "system",
    estimate_cpu: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> Found:
    """Every readable source of this machine; `statuses` also lists the unreadable ones.

    GPUs follow CUDA_VISIBLE_DEVICES, and of those only `gpus` are read: the engine's devices
    as CUDA indices (its process sees the same list), or "all". The CPU estimate joins only
    when no CPU package counter can be read, and not at all with `estimate_cpu=False`.
    """
    gpu_part = discover_nvml(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus)
    found = [gpu_part, discover_rapl(sysfs_root)]
    if estimate_cpu:
        cpu_counter = any(s.domain == "cpu" for part in found for s in part.sources)
        found.append(discover_estimate(cpu_counter, clock))
    return Found(
        sources=tuple(source for part in found for source in part.sources),
        statuses=tuple(status for part in found for status in part.statuses),
        coverage=_coverage(gpu_part, found[1:], scope),
    )


def _coverage(gpu_part: Discovery, host_parts: list[Discovery], scope: Scope) -> Coverage:
    """The GPUs' coverage (nvml decides it) joined by the CPU and DRAM sources in `scope`."""
    gpu = gpu_part.coverage or Coverage()
    estimated = {s.domain for part in host_parts for s in part.sources if s.method == "estimate"}
    in_scope_names = list(gpu.in_scope)
    missing = dict(gpu.missing)
    for status in (s for part in host_parts for s in part.statuses):
        if not in_scope(status.domain, scope) or status.reason == "superseded":
            continue
        if not status.available and status.domain in estimated:
            continue  # the labelled estimate stands in for the counters it could not read
        in_scope_names.append(status.name)
        if not status.available:
            missing[status.name] = status.reason or "unknown"
    return Coverage(tuple(in_scope_names), gpu.out_of_scope, missing)
