"""AMD GPUs through a fake of amdsmi: discovery, joules from counts, wraps, errors, `ipw power`."""

from collections.abc import Callable
from pathlib import Path
from typing import TypedDict, Unpack

import pytest

from openjarvis.power.amd import AmdGpu, discover_amd
from openjarvis.power.discovery import discover_sources
from openjarvis.power.meter import Meter
from tests.fakes.amdsmi import (
    AMDSMI_STATUS_DRIVER_NOT_LOADED,
    AMDSMI_STATUS_NO_PERM,
    FakeAmdGpu,
    FakeAmdSmi,
    install_fake_amdsmi,
)
from tests.fakes.clock import FakeClock

UUID = "e4ff74a1-0000-1000-80fd-0d1ee1b3d2a1"

PowerJson = Callable[[], dict[str, dict[str, object]]]


class GpuFields(TypedDict, total=False):
    """FakeAmdGpu's fields past its UUID."""

    market_name: str
    counts: int
    resolution_uj: float
    energy_error: int | None
    old_key: bool


def _one_gpu(monkeypatch: pytest.MonkeyPatch, **gpu: Unpack[GpuFields]) -> FakeAmdSmi:
    return install_fake_amdsmi(monkeypatch, FakeAmdSmi([FakeAmdGpu(UUID, **gpu)]))


def test_a_gpu_reads_its_accumulator_in_joules(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path
) -> None:
    fake = _one_gpu(monkeypatch, counts=1_000_000, resolution_uj=15.3)
    found = discover_amd()
    (gpu,) = found.sources
    assert isinstance(gpu, AmdGpu)
    assert (gpu.name, gpu.domain, gpu.method) == (f"amdsmi:{UUID}", "gpu", "counter")
    assert gpu.read() == pytest.approx(15.3)  # 10^6 counts of 15.3 uJ
    assert gpu.wrap_j == pytest.approx(2**64 * 15.3e-6)
    assert found.coverage is not None and found.coverage.in_scope == (f"amdsmi:{UUID}",)
    (status,) = found.statuses
    assert status.available and status.update_period_s == 0.001
    assert status.detail == "AMD Instinct MI300X, energy accumulator (15.3 uJ a count)"
    gpu.close()
    assert (fake.inits, fake.shutdowns) == (1, 1)  # discovery's reference and the source's


def test_amdsmi_before_6_2_1_named_the_count_power(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path
) -> None:
    _one_gpu(monkeypatch, counts=2_000, resolution_uj=1.0, old_key=True)
    (gpu,) = discover_amd().sources
    assert gpu.read() == pytest.approx(0.002)


def test_the_accumulator_wrapping_is_unwrapped(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path, clock: FakeClock
) -> None:
    fake = _one_gpu(monkeypatch, counts=2**64 - 1_000_000, resolution_uj=1.0)
    meter = Meter(discover_amd().sources, "accelerator", clock=clock)
    meter.poll()
    with meter.window("task") as window:
        clock.advance(0.5)
        fake.gpus[0].counts = 2**64 + 4_000_000  # past the uint64 range: it reads 4 J
        meter.poll()
        clock.advance(0.5)
        meter.poll()
    meter.settle()
    assert window.result.energy_j == pytest.approx(5.0, rel=0.05)  # 1 J to the wrap, 4 after


def test_an_unreadable_counter_is_none_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path, clock: FakeClock
) -> None:
    fake = _one_gpu(monkeypatch, energy_error=AMDSMI_STATUS_NO_PERM)
    found = discover_amd()
    assert found.sources == ()
    (status,) = found.statuses
    assert (status.available, status.reason) == (False, "permission")
    assert status.detail is not None and "`render` and `video` groups" in status.detail
    assert found.coverage is not None and found.coverage.missing == {f"amdsmi:{UUID}": "permission"}
    # Readable at first, then refused mid-run: the window is None with the reason, never 0.
    fake.gpus[0].energy_error = None
    meter = Meter(discover_amd().sources, "accelerator", clock=clock)
    meter.poll()
    with meter.window("task") as window:
        clock.advance(0.5)
        fake.gpus[0].energy_error = AMDSMI_STATUS_NO_PERM
        meter.poll()
        clock.advance(0.5)
    meter.settle()
    assert (window.result.energy_j, window.result.null_reason) == (None, "permission")


def test_no_driver_means_no_amd_gpu_to_miss(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path
) -> None:
    install_fake_amdsmi(monkeypatch, FakeAmdSmi([], init_error=AMDSMI_STATUS_DRIVER_NOT_LOADED))
    found = discover_amd()
    (status,) = found.statuses
    assert (status.name, status.reason) == ("amdsmi", "no-device")
    assert found.coverage is not None and not found.coverage.partial


def test_the_engines_gpus_pick_amd_gpus_when_no_nvidia_gpu_is_in_view(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path
) -> None:
    gpus = [FakeAmdGpu("gpu-a"), FakeAmdGpu("gpu-b")]
    install_fake_amdsmi(monkeypatch, FakeAmdSmi(gpus))
    found = discover_sources(gpus=(1,), scope="accelerator", estimate_cpu=False)
    assert [s.name for s in found.sources] == ["amdsmi:gpu-b"]
    assert found.coverage.in_scope == ("amdsmi:gpu-b",)
    assert found.coverage.out_of_scope == ("amdsmi:gpu-a",)
    for source in found.sources:
        source.close()


def test_ipw_power_lists_the_gpu_with_its_refresh_period(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path, power_json: PowerJson
) -> None:
    _one_gpu(monkeypatch)
    status = power_json()[f"amdsmi:{UUID}"]
    assert status["available"] is True and status["update_period_s"] == 0.001
