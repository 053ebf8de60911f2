"""Jetson INA3221 rails over fake sysfs trees (hwmon and iio): rails, domains, watts, no wrap to
handle, unreadable files, and `ipw power`."""

from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

from openjarvis.power import sysfs as power_sysfs
from openjarvis.power.discovery import discover_sources
from openjarvis.power.jetson import discover_jetson, rail_domain
from openjarvis.power.meter import Meter
from tests.fakes.clock import FakeClock
from tests.fakes.ina3221 import FakeHwmonIna3221, FakeIioIna3221
from tests.fakes.sysfs import FakePowercap

ORIN = ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]

PowerJson = Callable[[], dict[str, dict[str, object]]]


def test_hwmon_rails_are_volts_times_amps_and_the_sum_channel_is_skipped(tmp_path: Path) -> None:
    tree = FakeHwmonIna3221(tmp_path, ORIN)
    tree.set(2, 5000, 1200)  # 5 V x 1.2 A
    found = discover_jetson(tmp_path)
    rails = {s.name: s for s in found.sources}
    assert sorted(rails) == ["jetson:VDD_CPU_GPU_CV", "jetson:VDD_IN", "jetson:VDD_SOC"]
    assert rails["jetson:VDD_CPU_GPU_CV"].read() == pytest.approx(6.0)
    domains = {name: source.domain for name, source in rails.items()}
    assert domains == {
        "jetson:VDD_IN": "platform",
        "jetson:VDD_CPU_GPU_CV": "gpu",
        "jetson:VDD_SOC": "platform",
    }
    assert all(s.method == "integrated" and s.update_period_s == 0.01 for s in found.statuses)


def test_iio_rails_read_milliwatts(tmp_path: Path) -> None:
    tree = FakeIioIna3221(tmp_path, ["POM_5V_IN", "POM_5V_GPU", "POM_5V_CPU"])
    tree.set(1, 3250)
    rails = {s.name: s for s in discover_jetson(tmp_path).sources}
    assert rails["jetson:POM_5V_GPU"].read() == pytest.approx(3.25)
    assert [rails[n].domain for n in ("jetson:POM_5V_IN", "jetson:POM_5V_CPU")] == [
        "platform",
        "cpu",
    ]


def test_rail_domains_follow_their_labels() -> None:
    labels = ["VDD_GPU_SOC", "VDD_CPU_CV", "VDDQ_VDD2_1V8AO", "VDD_IN", "CV"]
    assert [rail_domain(label) for label in labels] == [
        "gpu",
        "cpu",
        "dram",
        "platform",
        "platform",
    ]


def test_power_is_integrated_and_there_is_no_counter_to_wrap(
    tmp_path: Path, clock: FakeClock
) -> None:
    tree = FakeHwmonIna3221(tmp_path, ORIN)
    sources = discover_jetson(tmp_path).sources
    assert all(s.wrap_j is None and s.reads == "power_w" for s in sources)
    meter = Meter(sources, "accelerator", clock=clock)
    tree.set(2, 5000, 2000)  # 10 W on the GPU's rail, held for 2 s
    meter.poll()
    with meter.window("task") as window:
        for _ in range(40):
            clock.advance(0.05)
            meter.poll()
    meter.settle()
    assert window.result.energy_j == pytest.approx(20.0, rel=0.05)
    assert window.result.method == "integrated"


def test_an_unreadable_rail_says_how_to_fix_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = FakeHwmonIna3221(tmp_path, ORIN)
    denied = tree.path("curr2_input")
    real_open = open

    def refusing_open(path: Path, mode: str) -> IO[bytes]:
        # Root reads any file: the kernel's EACCES is faked at power/sysfs.py's one open().
        if path == denied:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, mode)

    monkeypatch.setattr(power_sysfs, "open", refusing_open, raising=False)
    found = discover_jetson(tmp_path)
    statuses = {s.name: s for s in found.statuses}
    rail = statuses["jetson:VDD_CPU_GPU_CV"]
    assert (rail.available, rail.reason) == (False, "permission")
    assert rail.detail is not None and f"sudo chmod o+r {denied}" in rail.detail
    assert statuses["jetson:VDD_IN"].available


def test_an_unreadable_gpu_rail_makes_the_scope_partial(
    no_hardware: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = FakeHwmonIna3221(no_hardware, ORIN)
    (tree.dir / "curr2_input").write_text("garbage\n")
    found = discover_sources(scope="accelerator", estimate_cpu=False)
    jetson = {k: v for k, v in found.coverage.missing.items() if k.startswith("jetson")}
    assert jetson == {"jetson:VDD_CPU_GPU_CV": "read-error"}  # platform rails are never in it


def test_no_ina3221_is_no_device_and_misses_nothing(tmp_path: Path) -> None:
    FakePowercap(tmp_path)  # a sysfs root without i2c drivers
    found = discover_jetson(tmp_path)
    (status,) = found.statuses
    assert status.reason == "no-device" and found.coverage is not None
    assert not found.coverage.partial


def test_ipw_power_lists_the_rails_with_their_refresh_period(
    no_hardware: Path, power_json: PowerJson
) -> None:
    FakeHwmonIna3221(no_hardware, ORIN)
    status = power_json()["jetson:VDD_IN"]
    assert status["available"] is True and status["update_period_s"] == 0.01
