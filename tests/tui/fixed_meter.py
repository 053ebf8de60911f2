"""A meter with fixed figures, for the screen snapshots: every reply's window holds the same
joules and the trace always reads the same watts, so no figure on screen varies between runs.

The pilot tests use the real meter (conftest.py); only the snapshots need figures that repeat.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from openjarvis.power import Method, PowerSample, WindowEnergy

__all__ = ["FixedMeter"]


@dataclass(frozen=True, slots=True)
class FixedSource:
    name: str


class FixedWindow:
    def __init__(self, result: WindowEnergy) -> None:
        self.result = result

    def mark_first_token(self, time_s: float) -> None:
        pass  # the figures are fixed: no split


class FixedMeter:
    def __init__(self, energy_j: float = 12.5, power_w: float = 40.0) -> None:
        self.energy_j = energy_j
        self.power_w = power_w
        self.scoped_sources = (FixedSource("fixed:system"),)
        self.windows: list[str] = []

    @property
    def method(self) -> Method | None:
        return "counter"

    @contextmanager
    def window(self, label: str) -> Iterator[FixedWindow]:
        self.windows.append(label)
        yield FixedWindow(
            WindowEnergy(
                label=label,
                start_s=0.0,
                end_s=1.0,
                scope="system",
                method="counter",
                energy_j=self.energy_j,
                net_energy_j=None,
                null_reason=None,
                sources=(),
            )
        )

    def drain_trace(self) -> list[PowerSample]:
        return [PowerSample("fixed:system", time.monotonic(), self.power_w)]
