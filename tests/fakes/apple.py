"""A small fake of `zeus_apple_silicon` in the shapes its documentation gives: an
`AppleEnergyMonitor()` whose `get_cumulative_energy()` returns `AppleEnergyMetrics` with
millijoule fields (cpu_total_mj, gpu_mj, dram_mj, ane_mj, ...; None where the chip reports
none), and a RuntimeError where IOReport fails.

Tests put it in sys.modules["zeus_apple_silicon"]; the real library (macOS only) is never needed.
"""

import sys
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace

import pytest

__all__ = ["FakeIOReport", "install_fake_apple"]


@dataclass
class FakeIOReport:
    """The chip's cumulative energy in mJ; a field set to None is one the chip does not report."""

    energy_mj: dict[str, int | None] = field(
        default_factory=lambda: {"cpu_total_mj": 0, "gpu_mj": 0, "dram_mj": 0, "ane_mj": 0}
    )
    open_error: str | None = None  # AppleEnergyMonitor() raises RuntimeError with it
    read_error: str | None = None  # get_cumulative_energy() raises RuntimeError with it
    monitors: int = 0

    def module(self) -> ModuleType:
        fake = ModuleType("zeus_apple_silicon")
        report = self

        class AppleEnergyMonitor:
            def __init__(self) -> None:
                if report.open_error is not None:
                    raise RuntimeError(report.open_error)
                report.monitors += 1

            def get_cumulative_energy(self) -> SimpleNamespace:
                if report.read_error is not None:
                    raise RuntimeError(report.read_error)
                return SimpleNamespace(**report.energy_mj)

        vars(fake).update(AppleEnergyMonitor=AppleEnergyMonitor)
        return fake


def install_fake_apple(monkeypatch: pytest.MonkeyPatch, report: FakeIOReport) -> FakeIOReport:
    monkeypatch.setitem(sys.modules, "zeus_apple_silicon", report.module())
    return report
