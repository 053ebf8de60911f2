"""NVML through a fake pynvml: counter or integrated power, CUDA_VISIBLE_DEVICES, no library."""

import sys
from pathlib import Path

import pytest

from openjarvis.power.meter import Meter
from openjarvis.power.nvml import NvmlGpu, discover_nvml
from openjarvis.power.sources import EnergySource, ReadError
from tests.fakes import nvml as fake_nvml
from tests.fakes.clock import FakeClock
from tests.fakes.nvml import FakeGpu, SteppingCounter, install_fake_nvml
from tests.power.test_meter import known, spend

UUID_A = "GPU-aaaa1111-0000-0000-0000-000000000000"
UUID_B = "GPU-bbbb2222-0000-0000-0000-000000000000"


def two_gpus(energy_mj: int | None = 1_000_000) -> list[FakeGpu]:
    return [FakeGpu(UUID_A, energy_mj=energy_mj), FakeGpu(UUID_B, energy_mj=energy_mj)]


def nvml_gpus(sources: tuple[EnergySource, ...]) -> list[NvmlGpu]:
    """The sources as NVML's GPUs, which is all `discover_nvml` finds (asserted)."""
    gpus = [source for source in sources if isinstance(source, NvmlGpu)]
    assert len(gpus) == len(sources)
    return gpus


def test_energy_counter_is_read_in_joules_with_name_uuid_and_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install_fake_nvml(monkeypatch, two_gpus())
    found = discover_nvml(None)
    assert [source.name for source in found.sources] == [f"nvml:{UUID_A}", f"nvml:{UUID_B}"]
    gpu = nvml_gpus(found.sources)[0]
    assert (gpu.domain, gpu.method, gpu.reads) == ("gpu", "counter", "energy_j")
    assert gpu.read() == 1000.0
    assert (gpu.uuid, gpu.gpu_name, gpu.power_limit_w) == (UUID_A, "NVIDIA H200", 700.0)
    assert found.statuses[0].detail == "NVIDIA H200, 700 W limit, energy counter"


def test_counter_gpus_are_read_only_by_the_sampler_once_per_refresh(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    fake = install_fake_nvml(monkeypatch, two_gpus())
    SteppingCounter(clock, fake.gpus[0], lambda t: 300.0, phase_s=0.011)
    SteppingCounter(clock, fake.gpus[1], lambda t: 125.25, phase_s=0.052)
    meter = Meter(discover_nvml(None).sources, "accelerator", clock=clock, sleep=clock.sleep)
    spend(meter, clock, 1.0)  # the sampler learns each counter's refresh phase
    fake.calls = 0
    with meter.window("task") as window:
        assert fake.calls == 0  # a window's edges never call NVML (milliseconds a call)
        spend(meter, clock, 2.0)
        in_window = fake.calls
    assert window.result.energy_j == pytest.approx(600.0 + 250.5)
    assert window.result.method == "counter"
    # Once the phase is known: one read every `stride` refreshes per GPU (plus a check now
    # and then), never the power reading as well.
    refresh = meter._tracks[0].refresh
    assert refresh is not None
    assert 2 * 20 / refresh.stride <= in_window <= 2 * 20 / refresh.stride * 1.3
    # The result waits for each GPU's refresh after the end: a read of the refresh before
    # it (so the new value can only be the one waited for), one just after its earliest
    # time, and one more where that came too soon.
    assert fake.calls - in_window <= 2 * 3
    learned_s = [t.refresh.phase_s for t in meter._tracks if t.refresh is not None]
    phases = [phase_s % 0.1 for phase_s in known(learned_s)]
    assert phases == [pytest.approx(0.011, abs=0.004), pytest.approx(0.052, abs=0.004)]


def test_without_a_counter_power_is_integrated_between_samples(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    fake = install_fake_nvml(monkeypatch, [FakeGpu(UUID_A, energy_mj=None, power_mw=100_000)])
    (gpu,) = discover_nvml(None).sources
    assert (gpu.method, gpu.reads) == ("integrated", "power_w")
    meter = Meter([gpu], "accelerator", clock=clock)
    with meter.window("task") as window:
        for power_mw in [100_000, 300_000, 300_000, 300_000, 300_000]:
            clock.advance(0.25)
            fake.gpus[0].power_mw = power_mw
            meter.poll()
        clock.advance(0.25)
    # Trapezoids every 0.25 s: 100, 100->300, 300, 300, 300, 300 W.
    expected_j = 0.25 * (100 + 200 + 300 + 300 + 300 + 300)
    assert window.result.energy_j == pytest.approx(expected_j)
    assert window.result.method == "integrated"
    assert not window.result.low_resolution


def test_without_a_counter_instant_power_is_preferred_over_the_one_second_average(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # nvmlDeviceGetPowerUsage lags (a 1-s average on Ampere and newer): here it still says
    # 100 W while the GPU already draws 300 W. The instantaneous field must be the one read.
    gpu_spec = FakeGpu(UUID_A, energy_mj=None, power_mw=300_000, power_usage_mw=100_000)
    install_fake_nvml(monkeypatch, [gpu_spec])
    (gpu,) = nvml_gpus(discover_nvml(None).sources)
    assert (gpu.reading, gpu.method, gpu.reads) == ("instant_power", "integrated", "power_w")
    assert gpu.read() == 300.0
    assert gpu_spec.field_queries[-1] == fake_nvml.NVML_FI_DEV_POWER_INSTANT
    assert gpu.sample_period_s == gpu.update_period_s  # integrated: read at every update
    assert gpu.describe().endswith("instantaneous power, integrated")


def test_without_the_instant_field_power_usage_is_the_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old_driver = FakeGpu(
        UUID_A, energy_mj=None, power_mw=300_000, power_usage_mw=250_000, instant_power_field=False
    )
    install_fake_nvml(monkeypatch, [old_driver])
    (gpu,) = nvml_gpus(discover_nvml(None).sources)
    assert (gpu.reading, gpu.method) == ("power_usage", "integrated")
    assert gpu.read() == 250.0


def test_a_counter_gpu_never_queries_power(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install_fake_nvml(monkeypatch, two_gpus())
    found = discover_nvml(None)
    assert [gpu.reading for gpu in nvml_gpus(found.sources)] == ["energy_counter", "energy_counter"]
    assert all(not gpu.field_queries for gpu in fake.gpus)
    # The sampler reads the counter once per refresh; trace points are a second apart.
    assert all(gpu.sample_period_s == 1.0 and gpu.steps for gpu in found.sources)


def test_integrated_window_without_the_sampler_is_low_resolution(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    install_fake_nvml(monkeypatch, [FakeGpu(UUID_A, energy_mj=None, power_mw=100_000)])
    meter = Meter(discover_nvml(None).sources, "accelerator", clock=clock)
    with meter.window("task") as window:
        clock.advance(5.0)
    assert window.result.energy_j == pytest.approx(500.0)
    assert window.result.low_resolution


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("1", [UUID_B]),
        ("1,0", [UUID_B, UUID_A]),
        ("0,0", [UUID_A]),
        (UUID_B, [UUID_B]),
        ("GPU-bbbb", [UUID_B]),
        ("bbbb2222", [UUID_B]),
        ("0,7,1", [UUID_A]),  # CUDA stops at the first entry that names no GPU
    ],
)
def test_cuda_visible_devices_by_index_and_uuid(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path, visible: str, expected: list[str]
) -> None:
    install_fake_nvml(monkeypatch, two_gpus())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    meter = Meter.discover("accelerator", estimate_cpu=False)
    assert [source.name for source in meter.sources] == [f"nvml:{uuid}" for uuid in expected]
    meter.close()


def test_mig_instances_and_empty_lists_are_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_nvml(monkeypatch, two_gpus())
    mig = discover_nvml("MIG-0f0e0d0c-1111-2222-3333-444455556666")
    assert mig.sources == ()
    assert (mig.statuses[0].reason, mig.statuses[0].available) == ("unsupported", False)
    (hidden,) = discover_nvml("").statuses
    assert hidden.reason == "no-device"


def test_missing_library_is_unavailable_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    found = discover_nvml(None)
    assert found.sources == ()
    (status,) = found.statuses
    assert (status.name, status.reason) == ("nvml", "unsupported")
    assert status.detail is not None and "pip install nvidia-ml-py" in status.detail


def test_missing_driver_is_no_device_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_nvml(monkeypatch, [], init_error=fake_nvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    (status,) = discover_nvml(None).statuses
    assert (status.available, status.reason) == (False, "no-device")
    assert status.detail is not None and "install the NVIDIA driver" in status.detail


def test_a_lost_gpu_makes_the_window_none_and_nvml_is_released(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    fake = install_fake_nvml(monkeypatch, two_gpus())
    for gpu in fake.gpus:
        SteppingCounter(clock, gpu, lambda t: 10.0)
    meter = Meter(discover_nvml(None).sources, "accelerator", clock=clock, sleep=clock.sleep)
    assert fake.init_count == 2  # one reference per source
    spend(meter, clock, 0.5)
    with meter.window("task") as window:
        spend(meter, clock, 1.0)
        fake.gpus[1].lost = True
    assert (window.result.energy_j, window.result.null_reason) == (None, "vanished")
    assert window.result.sources[0].energy_j == pytest.approx(10.0, rel=1e-3)
    meter.close()
    assert fake.init_count == 0
    with pytest.raises(ReadError):
        meter.sources[0].read()


def test_the_fake_matches_the_real_pynvml() -> None:
    real = pytest.importorskip("pynvml")
    for name in dir(fake_nvml.FakeNvml):
        if name.startswith("nvml") or name.startswith("NVML_"):
            assert hasattr(real, name), name
        if name.startswith("NVML_ERROR_"):
            assert getattr(real, name) == getattr(fake_nvml, name), name
    assert issubclass(real.NVMLError, Exception)
