"""A small fake of the `pynvml` module (nvidia-ml-py): the calls OpenJarvis makes, and errors.

Tests put it in sys.modules["pynvml"]; tests/power/test_nvml.py checks it against the real one.
"""

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.fakes.clock import FakeClock

__all__ = ["FakeGpu", "FakeNvml", "SteppingCounter", "install_fake_nvml"]

# The values of the real library's constants (checked against it by a test).
NVML_SUCCESS = 0
NVML_FI_DEV_POWER_INSTANT = 186
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15


class NVMLError(Exception):
    """Like pynvml's: carries the NVML return code in `value`."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"NVML error {self.value}"


@dataclass
class FakeGpu:
    """One GPU. `energy_mj=None` means the energy counter is not supported (pre-Volta).

    `power_mw` is the instantaneous power; `power_usage_mw` what nvmlDeviceGetPowerUsage says
    (a trailing average on Ampere and newer; None: the instantaneous power, as on older GPUs).
    """

    uuid: str
    name: str = "NVIDIA H200"
    energy_mj: int | None = 0
    power_mw: int = 80_000
    power_usage_mw: int | None = None
    instant_power_field: bool = True  # False: a driver older than NVML_FI_DEV_POWER_INSTANT
    power_limit_mw: int = 700_000
    lost: bool = False
    energy_error: int | None = None  # an NVML error code that reading the counter raises
    field_queries: list[int] = field(default_factory=list)
    energy_reads: int = 0  # successful or not
    processes: list[int] = field(default_factory=list)  # pids with a compute context on it


class FakeNvml(ModuleType):
    """Stands in for the pynvml module; counts nvmlInit/nvmlShutdown like the real library."""

    NVMLError = NVMLError
    NVML_SUCCESS = NVML_SUCCESS
    NVML_FI_DEV_POWER_INSTANT = NVML_FI_DEV_POWER_INSTANT
    NVML_VALUE_TYPE_UNSIGNED_INT = NVML_VALUE_TYPE_UNSIGNED_INT
    NVML_ERROR_UNINITIALIZED = NVML_ERROR_UNINITIALIZED
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.init_error = init_error  # e.g. NVML_ERROR_LIBRARY_NOT_FOUND: no driver
        self.init_count = 0
        self.calls = 0  # device queries, to check the meter reads only what it needs

    def _device(self, handle: FakeGpu) -> FakeGpu:
        if self.init_count == 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if handle.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        self.calls += 1
        return handle

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        if self.init_count == 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self.init_count -= 1

    def nvmlDeviceGetCount(self) -> int:
        if self.init_count == 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self._device(self.gpus[index])

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return self._device(handle).uuid

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return self._device(handle).name

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeGpu) -> int:
        return self._device(handle).power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeGpu) -> int:
        gpu = self._device(handle)
        gpu.energy_reads += 1
        if gpu.energy_error is not None:
            raise NVMLError(gpu.energy_error)
        if gpu.energy_mj is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.energy_mj

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        gpu = self._device(handle)
        return gpu.power_mw if gpu.power_usage_mw is None else gpu.power_usage_mw

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid) for pid in self._device(handle).processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeGpu) -> list[SimpleNamespace]:
        self._device(handle)
        return []

    def nvmlDeviceGetFieldValues(
        self, handle: FakeGpu, field_ids: list[int]
    ) -> list[SimpleNamespace]:
        """Like the real call: one struct per field, each with its own return code."""
        gpu = self._device(handle)
        values = []
        for field_id in field_ids:
            gpu.field_queries.append(field_id)
            supported = field_id == NVML_FI_DEV_POWER_INSTANT and gpu.instant_power_field
            values.append(
                SimpleNamespace(
                    fieldId=field_id,
                    nvmlReturn=NVML_SUCCESS if supported else NVML_ERROR_NOT_SUPPORTED,
                    valueType=NVML_VALUE_TYPE_UNSIGNED_INT,
                    value=SimpleNamespace(uiVal=gpu.power_mw if supported else 0),
                )
            )
        return values


def install_fake_nvml(
    monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu], init_error: int | None = None
) -> FakeNvml:
    """Make `import pynvml` return a fake with these GPUs; CUDA_VISIBLE_DEVICES unset."""
    fake = FakeNvml(gpus, init_error)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


class SteppingCounter:
    """A GPU's total-energy counter as NVML keeps it: the board's energy grows with its power
    continuously, but a read returns the value of the last refresh (every `period_s`, from
    `phase_s`). `power_w(t)` gives the board's power; the fake clock's hook integrates it.
    """

    def __init__(
        self,
        clock: "FakeClock",
        gpu: FakeGpu,
        power_w: Callable[[float], float],
        period_s: float = 0.1,
        phase_s: float = 0.0,
        step_s: float = 0.0005,
    ) -> None:
        self.gpu = gpu
        self.power_w = power_w
        self.period_s = period_s
        self.step_s = step_s
        self.time_s = clock.now_s
        self.energy_j = 0.0
        self.next_refresh_s = phase_s + period_s * ((self.time_s - phase_s) // period_s + 1)
        gpu.energy_mj = 0
        clock.hooks.append(self.follow)

    def follow(self, now_s: float) -> None:
        """Integrate power up to `now_s`, publishing the energy at each refresh passed."""
        while self.time_s < now_s:
            step_s = min(self.step_s, now_s - self.time_s, self.next_refresh_s - self.time_s)
            middle_s = self.time_s + 0.5 * step_s
            self.energy_j += self.power_w(middle_s) * step_s
            self.time_s += step_s
            if self.time_s >= self.next_refresh_s - 1e-12:
                self.gpu.energy_mj = round(self.energy_j * 1000)
                self.next_refresh_s += self.period_s

    def true_energy_j(self, start_s: float, end_s: float, step_s: float = 0.0001) -> float:
        """The board's energy between two instants (what a perfect meter would say)."""
        steps = max(1, round((end_s - start_s) / step_s))
        width_s = (end_s - start_s) / steps
        return sum(self.power_w(start_s + (i + 0.5) * width_s) * width_s for i in range(steps))
