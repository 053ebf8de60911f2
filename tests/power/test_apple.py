"""Apple Silicon through a fake of zeus_apple_silicon: fields as sources, joules, a counter that
goes backwards, IOReport failing, and `ipw power`."""

from collections.abc import Callable
from pathlib import Path

import pytest

from openjarvis.power.apple import discover_apple
from openjarvis.power.discovery import discover_sources
from openjarvis.power.meter import Meter
from tests.fakes.apple import FakeIOReport, install_fake_apple
from tests.fakes.clock import FakeClock

PowerJson = Callable[[], dict[str, dict[str, object]]]


def test_cpu_gpu_and_dram_are_sources_and_absent_fields_are_none(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path
) -> None:
    report = FakeIOReport({"cpu_total_mj": 1500, "gpu_mj": 250, "dram_mj": None, "ane_mj": 0})
    install_fake_apple(monkeypatch, report)
    found = discover_apple()
    names = {s.name: s for s in found.sources}
    assert sorted(names) == ["apple:cpu", "apple:gpu"]  # this chip reports no DRAM energy
    assert names["apple:cpu"].read() == 1.5 and names["apple:gpu"].read() == 0.25
    assert (names["apple:gpu"].domain, names["apple:gpu"].method) == ("gpu", "counter")
    assert report.monitors == 1  # one IOReport subscription for every field
    assert all(s.available and s.update_period_s == 0.01 for s in found.statuses)


def test_the_cpu_counter_supersedes_the_estimate_and_the_gpu_is_in_scope(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path
) -> None:
    install_fake_apple(monkeypatch, FakeIOReport())
    found = discover_sources(scope="system")
    assert {"apple:cpu", "apple:gpu", "apple:dram"} <= {s.name for s in found.sources}
    assert "estimate:cpu" not in {s.name for s in found.sources}
    assert {"apple:cpu", "apple:gpu", "apple:dram"} <= set(found.coverage.in_scope)
    assert "rapl" not in found.coverage.in_scope  # no RAPL on a Mac: its CPU counter stands
    assert not any(name.startswith(("apple", "rapl")) for name in found.coverage.missing)


def test_a_window_is_the_counters_difference(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path, clock: FakeClock
) -> None:
    report = install_fake_apple(monkeypatch, FakeIOReport())
    meter = Meter(discover_apple().sources, "accelerator", clock=clock)
    meter.poll()
    with meter.window("task") as window:
        clock.advance(1.0)
        report.energy_mj["gpu_mj"] = 12_000
        meter.poll()
    meter.settle()
    assert window.result.energy_j == pytest.approx(12.0, rel=0.05)


def test_a_counter_that_goes_backwards_is_none_not_negative(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path, clock: FakeClock
) -> None:
    # IOReport's energy never wraps; lower than before means the subscription restarted.
    report = install_fake_apple(monkeypatch, FakeIOReport())
    report.energy_mj["gpu_mj"] = 50_000
    sources = discover_apple().sources
    assert all(s.wrap_j is None for s in sources)
    meter = Meter(sources, "accelerator", clock=clock)
    meter.poll()
    with meter.window("task") as window:
        clock.advance(0.5)
        report.energy_mj["gpu_mj"] = 1_000
        meter.poll()
        clock.advance(0.5)
    meter.settle()
    assert window.result.energy_j is None
    assert window.result.null_reason == "read-error"


def test_ioreport_failing_is_unreadable_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path
) -> None:
    install_fake_apple(monkeypatch, FakeIOReport(read_error="IOReportCreateSamples failed"))
    found = discover_apple()
    assert found.sources == ()
    (status,) = found.statuses
    assert (status.available, status.reason) == (False, "read-error")
    assert status.detail is not None and "IOReportCreateSamples failed" in status.detail
    assert found.coverage is not None and found.coverage.missing == {"apple": "read-error"}
    install_fake_apple(monkeypatch, FakeIOReport(open_error="no IOReport channels"))
    (status,) = discover_apple().statuses
    assert (status.reason, status.available) == ("unsupported", False)


def test_elsewhere_it_says_this_is_no_mac_and_misses_nothing(no_hardware: Path) -> None:
    found = discover_apple()
    (status,) = found.statuses
    assert status.reason == "no-device" and "not an Apple Silicon Mac" in (status.detail or "")
    assert found.coverage is not None and not found.coverage.partial


def test_ipw_power_lists_the_sources_with_their_refresh_period(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path, power_json: PowerJson
) -> None:
    install_fake_apple(monkeypatch, FakeIOReport())
    status = power_json()["apple:gpu"]
    assert status["available"] is True and status["update_period_s"] == 0.01
