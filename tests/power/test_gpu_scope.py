"""Which GPUs a meter reads (the engine's devices as CUDA indices, or every visible one) and what
its scope covers, leaves out and cannot read. NVML and sysfs are faked; the rest runs for real.
"""

import sys
from pathlib import Path

import pytest

from openjarvis.power.discovery import discover_sources
from openjarvis.power.meter import Meter
from openjarvis.power.types import Coverage, GpuSelection
from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeGpu, FakeNvml, install_fake_nvml
from tests.fakes.sysfs import two_sockets

UUID_A = "GPU-aaaa1111-0000-0000-0000-000000000000"
UUID_B = "GPU-bbbb2222-0000-0000-0000-000000000000"
GPU_A, GPU_B = f"nvml:{UUID_A}", f"nvml:{UUID_B}"
MIG = "MIG-0f0e0d0c-1111-2222-3333-444455556666"


def two_gpus(monkeypatch: pytest.MonkeyPatch, energy_error: int | None = None) -> FakeNvml:
    gpus = [FakeGpu(UUID_A, energy_mj=1_000_000, energy_error=energy_error), FakeGpu(UUID_B)]
    return install_fake_nvml(monkeypatch, gpus)


def metered(gpus: GpuSelection) -> Meter:
    return Meter.discover("accelerator", gpus=gpus, estimate_cpu=False)


@pytest.mark.parametrize(
    ("visible", "devices", "read", "left_out"),
    [
        (None, (0,), GPU_A, GPU_B),  # a one-GPU engine on a two-GPU machine
        (None, (1,), GPU_B, GPU_A),
        ("1,0", (1,), GPU_A, GPU_B),  # CUDA index 1 is the second entry: physical GPU 0
    ],
)
def test_an_engine_on_one_device_meters_that_gpu_alone(
    monkeypatch: pytest.MonkeyPatch,
    no_hardware: Path,
    visible: str | None,
    devices: tuple[int, ...],
    read: str,
    left_out: str,
) -> None:
    fake = two_gpus(monkeypatch)
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with metered(devices) as meter:
        assert [source.name for source in meter.sources] == [read]
        assert meter.coverage == Coverage(in_scope=(read,), out_of_scope=(left_out,))
        assert not meter.coverage.partial
    unused = next(gpu for gpu in fake.gpus if f"nvml:{gpu.uuid}" == left_out)
    assert unused.energy_reads == 0  # out of scope: not even probed


def test_all_meters_every_visible_gpu(monkeypatch: pytest.MonkeyPatch, no_hardware: Path) -> None:
    two_gpus(monkeypatch)
    with metered("all") as meter:
        assert [source.name for source in meter.sources] == [GPU_A, GPU_B]
        assert meter.coverage == Coverage(in_scope=(GPU_A, GPU_B))


def test_device_0_under_cuda_visible_devices_1_is_physical_gpu_1(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path
) -> None:
    fake = two_gpus(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with metered((0,)) as meter:
        assert [source.name for source in meter.sources] == [GPU_B]
        # GPU 0 is hidden from CUDA: neither in scope nor listed as left out.
        assert meter.coverage == Coverage(in_scope=(GPU_B,))
    assert fake.gpus[0].energy_reads == 0


def test_a_gpu_in_scope_that_cannot_be_read_makes_the_scope_partial(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path
) -> None:
    two_gpus(monkeypatch, energy_error=fake_nvml.NVML_ERROR_NO_PERMISSION)
    with metered((0,)) as meter:
        assert meter.sources == ()
        assert meter.coverage == Coverage(
            in_scope=(GPU_A,), out_of_scope=(GPU_B,), missing={GPU_A: "permission"}
        )
        assert meter.coverage.partial
        assert meter.coverage.to_dict() == {
            "in_scope": [GPU_A],
            "out_of_scope": [GPU_B],
            "missing": {GPU_A: "permission"},
        }


def test_an_unreadable_gpu_out_of_scope_does_not_make_it_partial(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path
) -> None:
    fake = two_gpus(monkeypatch, energy_error=fake_nvml.NVML_ERROR_NO_PERMISSION)
    with metered((1,)) as meter:
        assert meter.coverage == Coverage(in_scope=(GPU_B,), out_of_scope=(GPU_A,))
    assert fake.gpus[0].energy_reads == 0


def test_a_cpu_engine_under_the_accelerator_scope_has_nothing_in_scope(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path
) -> None:
    fake = two_gpus(monkeypatch)
    with metered(()) as meter:
        assert meter.sources == ()
        assert meter.coverage == Coverage(out_of_scope=(GPU_A, GPU_B))
        assert meter.method is None
    assert [gpu.energy_reads for gpu in fake.gpus] == [0, 0]


@pytest.mark.parametrize(
    ("gpus", "missing"),
    [
        ((0,), {"nvml": "unsupported"}),
        ("all", {"nvml": "unsupported"}),  # GPUs may be there: nobody can tell
        ((), {}),
    ],
)
def test_without_nvidia_ml_py_the_gpus_wanted_are_missing(
    no_hardware: Path, gpus: GpuSelection, missing: dict[str, str]
) -> None:
    coverage = discover_sources(gpus=gpus, scope="accelerator", estimate_cpu=False).coverage
    assert coverage.missing == missing
    assert coverage.in_scope == tuple(missing)


@pytest.mark.parametrize(("gpus", "missing"), [((0,), {"nvml": "no-device"}), ("all", {})])
def test_without_a_driver_all_gpus_are_none_but_a_device_asked_for_is_missing(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path, gpus: GpuSelection, missing: dict
) -> None:
    install_fake_nvml(monkeypatch, [], init_error=fake_nvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    coverage = discover_sources(gpus=gpus, scope="accelerator", estimate_cpu=False).coverage
    assert coverage.missing == missing


def test_a_device_past_the_visible_list_is_missing(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path
) -> None:
    two_gpus(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    found = discover_sources(gpus=(0, 1), scope="accelerator", estimate_cpu=False)
    assert [source.name for source in found.sources] == [GPU_B]
    assert found.coverage.missing == {"nvml:cuda:1": "no-device"}
    for source in found.sources:
        source.close()


@pytest.mark.parametrize(("gpus", "missing"), [((0,), {"nvml": "no-device"}), ("all", {})])
def test_an_empty_cuda_visible_devices_hides_every_gpu(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path, gpus: GpuSelection, missing: dict
) -> None:
    two_gpus(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    found = discover_sources(gpus=gpus, scope="accelerator", estimate_cpu=False)
    assert found.sources == ()
    assert found.coverage.missing == missing
    (status,) = [status for status in found.statuses if status.name.startswith("nvml")]
    assert status.detail is not None and "hides every GPU" in status.detail


def test_a_mig_instance_cuda_would_use_is_missing_under_all(
    monkeypatch: pytest.MonkeyPatch, no_hardware: Path
) -> None:
    two_gpus(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"0,{MIG}")
    found = discover_sources(gpus="all", scope="accelerator", estimate_cpu=False)
    assert found.coverage.missing == {f"nvml:{MIG}": "unsupported"}
    assert found.coverage.in_scope == (GPU_A, f"nvml:{MIG}")
    for source in found.sources:
        source.close()


def test_system_scope_lists_cpu_and_dram_and_misses_an_unreadable_dram_zone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    tree = two_sockets(tmp_path)
    tree.deny_read("intel-rapl:1:2")  # dram of socket 1
    tree.install(monkeypatch)
    system = discover_sources(gpus=(), scope="system").coverage
    assert system.in_scope == ("rapl:package-0", "rapl:dram-0", "rapl:package-1", "rapl:dram-1")
    assert system.missing == {"rapl:dram-1": "permission"}
    # Under the accelerator scope the CPU and DRAM are outside: nothing of theirs is missing.
    assert discover_sources(gpus=(), scope="accelerator").coverage == Coverage()


def test_the_cpu_estimate_stands_in_for_unreadable_packages_but_not_when_turned_off(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    tree = two_sockets(tmp_path)
    for zone in ("intel-rapl:0", "intel-rapl:1", "intel-rapl:0:2", "intel-rapl:1:2"):
        tree.deny_read(zone)
    tree.install(monkeypatch)
    estimated = discover_sources(gpus=(), scope="system").coverage
    # The estimate covers the packages (labelled `estimate`); nothing estimates DRAM.
    assert estimated.missing == {"rapl:dram-0": "permission", "rapl:dram-1": "permission"}
    assert "estimate:cpu" in estimated.in_scope
    without = discover_sources(gpus=(), scope="system", estimate_cpu=False).coverage
    assert set(without.missing) == {"rapl:package-0", "rapl:package-1", *estimated.missing}
