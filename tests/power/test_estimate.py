"""The CPU estimate: the TDP table, core scaling, and modelled joules from CPU time deltas."""

from collections import namedtuple

import psutil
import pytest

from openjarvis.power.estimate import (
    CpuEstimate,
    busy_cpu_s,
    discover_estimate,
    load_tdp_table,
    power_model,
)
from openjarvis.power.meter import Meter
from tests.fakes.clock import FakeClock

# The shape of psutil.cpu_times() on Linux.
CpuTimes = namedtuple(
    "CpuTimes",
    "user nice system idle iowait irq softirq steal guest guest_nice",
)


def cpu_times(busy_s: float, idle_s: float, steal_s: float = 0.0) -> CpuTimes:
    # Guest time is inside user already, so it must not be counted twice.
    return CpuTimes(busy_s - 1.0, 0.0, 1.0, idle_s, 0.0, 0.0, 0.0, steal_s, 5.0, 0.0)


def test_every_row_has_a_source_and_sane_figures() -> None:
    table = load_tdp_table()
    assert any(row.model_substring == "*" for row in table)
    for row in table:
        assert row.source.strip(), row
        assert row.tdp_w > 0 and row.threads >= row.cores >= 1, row
        assert 0 < row.idle_fraction < 1, row


@pytest.mark.parametrize(
    ("cpu_model", "row"),
    [
        ("AMD EPYC", "AMD EPYC"),
        ("AMD EPYC 7763 64-Core Processor", "AMD EPYC 7763"),
        ("AMD EPYC 7R13 Processor", "AMD EPYC 7"),
        ("AMD EPYC-Milan Processor", "AMD EPYC-Milan"),
        ("Intel(R) Xeon(R) Platinum 8480+", "Intel Xeon Platinum 8480+"),
        ("Intel(R) Xeon(R) CPU @ 2.20GHz", "Intel Xeon"),
        ("Some Unknown CPU", "*"),
    ],
)
def test_the_longest_matching_row_wins(cpu_model: str, row: str) -> None:
    assert power_model(cpu_model, logical_cpus=2).row.model_substring == row


def test_power_scales_by_this_machines_cpus_over_the_chips_threads() -> None:
    model = power_model("AMD EPYC", logical_cpus=2)
    assert model.max_power_w == pytest.approx(280 * 2 / 128)  # 4.375 W
    assert model.idle_power_w == pytest.approx(0.30 * 4.375)
    assert power_model("Some Unknown CPU", logical_cpus=2).max_power_w == pytest.approx(8.0)


def test_busy_time_excludes_idle_iowait_steal_and_guest() -> None:
    times = CpuTimes(3.0, 1.0, 2.0, 50.0, 4.0, 0.5, 0.5, 9.0, 2.0, 1.0)
    assert busy_cpu_s(times) == pytest.approx(3.0 + 1.0 + 2.0 + 0.5 + 0.5)


def test_window_energy_follows_the_model(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> None:
    times = {"now": cpu_times(busy_s=10.0, idle_s=100.0)}
    monkeypatch.setattr(psutil, "cpu_times", lambda: times["now"])
    model = power_model("AMD EPYC", logical_cpus=2)
    meter = Meter([CpuEstimate(model, clock)], "system", clock=clock)
    with meter.window("task") as window:
        clock.advance(2.0)
        # One of two CPUs busy for the 2 s (u = 0.5); steal is another tenant's.
        times["now"] = cpu_times(busy_s=12.0, idle_s=102.0, steal_s=3.0)
    idle_w, max_w = 0.30 * 4.375, 4.375
    expected_j = (idle_w + (max_w - idle_w) * 0.5) * 2.0
    assert window.result.energy_j == pytest.approx(expected_j)
    assert window.result.method == "estimate"


def test_estimate_is_offered_only_without_a_cpu_counter(clock: FakeClock) -> None:
    superseded = discover_estimate(cpu_counter_available=True, clock=clock)
    assert superseded.sources == ()
    assert superseded.statuses[0].reason == "superseded"
    offered = discover_estimate(cpu_counter_available=False, clock=clock, cpu_model="AMD EPYC")
    assert [source.name for source in offered.sources] == ["estimate:cpu"]
    assert offered.statuses[0].detail is not None and "AMD EPYC 7763" in offered.statuses[0].detail


def test_reads_this_machines_real_cpu_times() -> None:
    (source,) = discover_estimate(cpu_counter_available=False).sources
    first = source.read()
    assert source.read() >= first > 0
