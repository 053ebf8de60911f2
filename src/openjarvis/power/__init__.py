"""The energy meter: GPU (NVML), CPU and DRAM (RAPL) sources, a CPU estimate, and the Meter.

Start with `Meter.discover()`; docs/energy.md says what the numbers mean.
"""

from openjarvis.power.meter import Meter, WindowHandle
from openjarvis.power.sources import Discovery, EnergySource, ReadError
from openjarvis.power.types import (
    Domain,
    IdleBaseline,
    Method,
    PowerSample,
    Scope,
    SourceEnergy,
    SourceStatus,
    TotalEnergy,
    WindowEnergy,
    weakest_method,
)

__all__ = [
    "Discovery",
    "Domain",
    "EnergySource",
    "IdleBaseline",
    "Meter",
    "Method",
    "PowerSample",
    "ReadError",
    "Scope",
    "SourceEnergy",
    "SourceStatus",
    "TotalEnergy",
    "WindowEnergy",
    "WindowHandle",
    "weakest_method",
]
