"""AMD GPUs through AMD SMI (`amdsmi`, shipped with ROCm): each GPU's energy accumulator.

`amdsmi` is imported here and nowhere else; its errors are translated here. Not run on AMD
hardware by this project yet: built and tested against the library's documented API.
"""

import contextlib
import io
from types import ModuleType
from typing import Any

from openjarvis.power.sources import Discovery, EnergySource, ReadError, unavailable
from openjarvis.power.types import Coverage, GpuSelection

__all__ = ["AMD_STATUS_REASONS", "AmdGpu", "discover_amd"]

# amdsmi_status_t values (amdsmi.h) and our reason codes for them.
AMD_STATUS_REASONS = {
    2: "unsupported",  # AMDSMI_STATUS_NOT_SUPPORTED (also inside a virtual machine guest)
    10: "permission",  # AMDSMI_STATUS_NO_PERM
    31: "vanished",  # AMDSMI_STATUS_NOT_FOUND
    34: "no-device",  # AMDSMI_STATUS_DRIVER_NOT_LOADED
}
_FIXES = {
    "unsupported": "this GPU, its firmware or a VM guest does not offer it",
    "permission": "run as a user in the `render` and `video` groups",
    "vanished": "the GPU is gone: check `amd-smi list` and dmesg",
    "no-device": "the amdgpu driver is not loaded: check `amd-smi list`",
    "read-error": "check `amd-smi metric --energy`",
}
# A generous ceiling on one GPU's power (an MI300X is rated 750 W): the longest gap between
# reads that cannot hide a wrap of the accumulator is its range over this.
MAX_GPU_POWER_W = 2000.0
_ACCUMULATOR_RANGE = 2**64  # uint64_t energy_accumulator


def _translate(amdsmi: ModuleType, error: Exception, what: str) -> ReadError:
    """An AmdSmiLibraryException as one of our reason codes, with the fix."""
    code = getattr(error, "get_error_code", lambda: None)()
    reason = AMD_STATUS_REASONS.get(code, "read-error") if isinstance(code, int) else "read-error"
    return ReadError(reason, f"AMD SMI {what}: {error}; {_FIXES[reason]}")


class _Session:
    """amdsmi_init once for every source of a discovery; shut down when the last one closes."""

    def __init__(self, amdsmi: ModuleType) -> None:
        self.amdsmi = amdsmi
        self.users = 0

    def release(self) -> None:
        self.users -= 1
        if self.users == 0:
            self.amdsmi.amdsmi_shut_down()


class AmdGpu(EnergySource):
    """One GPU's energy accumulator: counts of `counter_resolution` microjoules, a uint64 that
    wraps (in principle: at ~15 uJ a count, after ~10^14 J)."""

    domain = "gpu"
    method = "counter"
    reads = "energy_j"
    # The accumulator's refresh period is not documented: the value is taken as current when
    # read (no stepping learned), and 1 ms as its resolution in time. Not measured here.
    update_period_s = 0.001
    sample_period_s = 0.1
    edge_reads = False  # a library call into the driver: read by the sampler, not the caller

    def __init__(
        self, session: _Session, handle: Any, uuid: str, gpu_name: str, resolution_uj: float
    ) -> None:
        session.users += 1
        self._session: _Session | None = session
        self._handle = handle
        self.uuid = uuid
        self.gpu_name = gpu_name
        self.resolution_uj = resolution_uj
        self.name = f"amdsmi:{uuid}"
        self.wrap_j = _ACCUMULATOR_RANGE * resolution_uj / 1e6
        self.max_read_interval_s = self.wrap_j / MAX_GPU_POWER_W

    def read(self) -> float:
        session = self._session
        if session is None:
            raise ReadError("read-error", f"{self.name} was closed")
        counts, resolution_uj = _energy_count(session.amdsmi, self._handle, self.name)
        # Counts past the range come back reduced, so the Meter sees a wrap at wrap_j.
        return (counts % _ACCUMULATOR_RANGE) * resolution_uj / 1e6

    def close(self) -> None:
        if self._session is not None:
            self._session.release()
            self._session = None

    def describe(self) -> str:
        return f"{self.gpu_name}, energy accumulator ({self.resolution_uj:g} uJ a count)"


def _energy_count(amdsmi: ModuleType, handle: Any, name: str) -> tuple[int, float]:
    """(accumulator counts, microjoules a count); amdsmi before 6.2.1 named the counts `power`."""
    try:
        reply = amdsmi.amdsmi_get_energy_count(handle)
    except amdsmi.AmdSmiLibraryException as error:
        raise _translate(amdsmi, error, f"reading {name}") from error
    counts = reply.get("energy_accumulator", reply.get("power"))
    resolution = reply.get("counter_resolution")
    if not isinstance(counts, int) or not isinstance(resolution, int | float) or resolution <= 0:
        raise ReadError("read-error", f"AMD SMI gave {name} no usable energy count: {reply!r}")
    return counts, float(resolution)


def _import_amdsmi() -> ModuleType | None:
    try:
        # amdsmi prints to stdout when it cannot find libamd_smi.so.
        with contextlib.redirect_stdout(io.StringIO()):
            import amdsmi
    except (ImportError, OSError, AttributeError, KeyError):
        return None  # not installed, or a library that does not match the installed ROCm
    return amdsmi


def discover_amd(gpus: GpuSelection = "all") -> Discovery:
    """AMD GPUs that AMD SMI lists, probed; `gpus` picks by index in its list (ROCm's order,
    which is HIP's by default). Without amdsmi, ROCm or a GPU: a status that says so."""
    amdsmi = _import_amdsmi()
    if amdsmi is None:
        detail = (
            "amdsmi is not installed (or does not match the ROCm here): on a machine with AMD "
            "GPUs, `pip install amdsmi` of the installed ROCm's version (the amd extra)"
        )
        status = unavailable("amdsmi", "gpu", "counter", "no-device", detail)
        return Discovery((), (status,), Coverage())  # no AMD GPU to miss
    try:
        amdsmi.amdsmi_init()
    except amdsmi.AmdSmiLibraryException as error:
        return _amdsmi_failed(_translate(amdsmi, error, "start"))
    session = _Session(amdsmi)
    session.users += 1  # discovery's own reference, released below
    try:
        return _discover_devices(session, gpus)
    except amdsmi.AmdSmiLibraryException as error:
        return _amdsmi_failed(_translate(amdsmi, error, "listing GPUs"))
    finally:
        session.release()


def _amdsmi_failed(problem: ReadError) -> Discovery:
    """AMD SMI as a whole is unusable: its GPUs are missing, unless there are none (no driver)."""
    status = unavailable("amdsmi", "gpu", "counter", problem.reason, problem.detail)
    if problem.reason == "no-device":
        return Discovery((), (status,), Coverage())
    return Discovery((), (status,), Coverage(("amdsmi",), (), {"amdsmi": problem.reason}))


def _discover_devices(session: _Session, gpus: GpuSelection) -> Discovery:
    amdsmi = session.amdsmi
    handles = list(amdsmi.amdsmi_get_processor_handles())
    if not handles:
        detail = "AMD SMI runs but lists no GPU: check `amd-smi list`"
        status = unavailable("amdsmi", "gpu", "counter", "no-device", detail)
        return Discovery((), (status,), Coverage())
    uuids = [str(amdsmi.amdsmi_get_gpu_device_uuid(handle)) for handle in handles]
    chosen = list(range(len(handles))) if gpus == "all" else list(dict.fromkeys(gpus))
    candidates: list[EnergySource] = []
    unreachable: dict[str, str] = {}
    for index in chosen:
        if not 0 <= index < len(handles):
            unreachable[f"amdsmi:gpu:{index}"] = "no-device"
            continue
        handle = handles[index]
        name = str(amdsmi.amdsmi_get_gpu_asic_info(handle).get("market_name") or "AMD GPU")
        try:
            _, resolution_uj = _energy_count(amdsmi, handle, f"amdsmi:{uuids[index]}")
        except ReadError:
            resolution_uj = 1.0  # kept: its probe reports what went wrong
        candidates.append(AmdGpu(session, handle, uuids[index], name, resolution_uj))
    found = Discovery.of(candidates, [])
    missing = {s.name: s.reason or "unknown" for s in found.statuses if not s.available}
    coverage = Coverage(
        in_scope=tuple(c.name for c in candidates) + tuple(unreachable),
        out_of_scope=tuple(
            f"amdsmi:{uuid}" for index, uuid in enumerate(uuids) if index not in chosen
        ),
        missing=missing | unreachable,
    )
    return Discovery(found.sources, found.statuses, coverage)
