"""A small fake of the `amdsmi` module (AMD SMI's Python bindings), in the shapes its
documentation gives: processor handles, the GPU's UUID and ASIC info, `amdsmi_get_energy_count`
as a dict (`energy_accumulator`, `counter_resolution` in uJ, `timestamp`; before 6.2.1 the count
was named `power`), and `AmdSmiLibraryException` carrying an amdsmi_status_t code.

Tests put it in sys.modules["amdsmi"]; the real library is never needed.
"""

import sys
from dataclasses import dataclass, field
from types import ModuleType

import pytest

__all__ = ["AmdSmiLibraryException", "FakeAmdGpu", "FakeAmdSmi", "install_fake_amdsmi"]

AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_NO_PERM = 10
AMDSMI_STATUS_DRIVER_NOT_LOADED = 34


class AmdSmiLibraryException(Exception):
    """Like amdsmi's: `get_error_code()` is the amdsmi_status_t, `get_error_info()` its text."""

    def __init__(self, err_code: int) -> None:
        super().__init__(err_code)
        self.err_code = err_code

    def get_error_code(self) -> int:
        return self.err_code

    def get_error_info(self) -> str:
        return f"AMDSMI_STATUS {self.err_code}"

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | {self.get_error_info()}"


@dataclass
class FakeAmdGpu:
    uuid: str
    market_name: str = "AMD Instinct MI300X"
    counts: int = 0  # the energy accumulator
    resolution_uj: float = 15.3
    energy_error: int | None = None  # a status code that reading the count raises
    old_key: bool = False  # amdsmi before 6.2.1 named the count "power"


@dataclass
class FakeAmdSmi:
    gpus: list[FakeAmdGpu]
    init_error: int | None = None
    inits: int = 0
    shutdowns: int = 0
    calls: list[str] = field(default_factory=list)

    def module(self) -> ModuleType:
        fake = ModuleType("amdsmi")

        def amdsmi_init() -> None:
            if self.init_error is not None:
                raise AmdSmiLibraryException(self.init_error)
            self.inits += 1

        def amdsmi_shut_down() -> None:
            self.shutdowns += 1

        def amdsmi_get_energy_count(handle: FakeAmdGpu) -> dict[str, object]:
            self.calls.append(f"energy:{handle.uuid}")
            if handle.energy_error is not None:
                raise AmdSmiLibraryException(handle.energy_error)
            key = "power" if handle.old_key else "energy_accumulator"
            return {key: handle.counts, "counter_resolution": handle.resolution_uj, "timestamp": 0}

        def amdsmi_get_processor_handles() -> list[FakeAmdGpu]:
            return list(self.gpus)

        def amdsmi_get_gpu_device_uuid(handle: FakeAmdGpu) -> str:
            return handle.uuid

        def amdsmi_get_gpu_asic_info(handle: FakeAmdGpu) -> dict[str, str]:
            return {"market_name": handle.market_name, "vendor_id": "0x1002"}

        vars(fake).update(
            AmdSmiLibraryException=AmdSmiLibraryException,
            amdsmi_init=amdsmi_init,
            amdsmi_shut_down=amdsmi_shut_down,
            amdsmi_get_processor_handles=amdsmi_get_processor_handles,
            amdsmi_get_gpu_device_uuid=amdsmi_get_gpu_device_uuid,
            amdsmi_get_gpu_asic_info=amdsmi_get_gpu_asic_info,
            amdsmi_get_energy_count=amdsmi_get_energy_count,
        )
        return fake


def install_fake_amdsmi(monkeypatch: pytest.MonkeyPatch, fake: FakeAmdSmi) -> FakeAmdSmi:
    monkeypatch.setitem(sys.modules, "amdsmi", fake.module())
    return fake
