"""Which energy sources a meter reads: the GPUs the engine runs on (or every visible one), CPU
packages and DRAM, Apple Silicon's and Jetson's on-chip readings, and the labelled CPU estimate
where no CPU counter can be read.
"""

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from openjarvis.power.accounting import in_scope
from openjarvis.power.amd import discover_amd
from openjarvis.power.apple import discover_apple
from openjarvis.power.estimate import discover_estimate
from openjarvis.power.jetson import discover_jetson
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
    as CUDA indices (its process sees the same list), or "all". AMD GPUs take the same indices
    where no NVIDIA GPU is visible (ROCm's torch calls them CUDA devices too); integrated GPUs
    (Apple Silicon, Jetson) are always read. The CPU estimate joins only when no CPU counter can
    be read, and not at all with `estimate_cpu=False`.
    """
    nvidia = discover_nvml(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus)
    nvidia_seen = any(s.name.startswith("nvml:GPU-") for s in nvidia.statuses) or bool(
        nvidia.coverage and nvidia.coverage.out_of_scope
    )
    # With NVIDIA GPUs in view, the engine's CUDA indices are theirs: AMD ones are not its own.
    amd = discover_amd(() if nvidia_seen and gpus != "all" else gpus)
    if not nvidia_seen and amd.sources:  # the engine's devices are AMD's: NVML misses none
        nvidia = Discovery(nvidia.sources, nvidia.statuses, Coverage())
    found = [nvidia, amd, discover_apple(), discover_jetson(sysfs_root), discover_rapl(sysfs_root)]
    if estimate_cpu:
        cpu_counter = any(s.domain == "cpu" for part in found for s in part.sources)
        found.append(discover_estimate(cpu_counter, clock))
    return Found(
        sources=tuple(source for part in found for source in part.sources),
        statuses=tuple(status for part in found for status in part.statuses),
        coverage=_coverage(found, scope),
    )


def _coverage(parts: list[Discovery], scope: Scope) -> Coverage:
    """What `scope` covers: a part that decided its own coverage (a GPU selection, or nothing of
    its kind here) says so; the others' sources in `scope` are in it, and missing where their
    probe failed, unless another part's source reads that domain (the labelled CPU estimate
    standing in for RAPL, or a Mac's own CPU counter where there is no RAPL)."""
    in_scope_names: list[str] = []
    out_of_scope: list[str] = []
    missing: dict[str, str] = {}
    for part in parts:
        if part.coverage is not None:
            in_scope_names += part.coverage.in_scope
            out_of_scope += part.coverage.out_of_scope
            missing |= part.coverage.missing
            continue
        elsewhere = {s.domain for other in parts if other is not part for s in other.sources}
        for status in part.statuses:
            if not in_scope(status.domain, scope) or status.reason == "superseded":
                continue
            if not status.available and status.domain in elsewhere:
                continue
            in_scope_names.append(status.name)
            if not status.available:
                missing[status.name] = status.reason or "unknown"
    return Coverage(tuple(in_scope_names), tuple(out_of_scope), missing)
