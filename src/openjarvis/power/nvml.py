"""NVIDIA GPUs through NVML: the total-energy counter where supported, else power readings.

`pynvml` (nvidia-ml-py) is imported here and nowhere else; its errors are translated here.
"""

from types import ModuleType
from typing import Any, Literal

from openjarvis.power.sources import Discovery, EnergySource, ReadError, unavailable
from openjarvis.power.types import Coverage, GpuSelection, SourceStatus

__all__ = ["NvmlGpu", "NvmlReading", "discover_nvml", "has_instant_power", "select_visible"]

_NO_DRIVER_FIX = (
    "no NVIDIA driver found (libnvidia-ml.so.1 missing or the kernel module not loaded): "
    "install the NVIDIA driver, or measure with --scope system"
)


def _translate(nvml: ModuleType, error: Exception, what: str) -> ReadError:
    """An NVMLError as one of our reason codes, with what to do about it."""
    value = getattr(error, "value", None)
    codes = {
        getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3): "unsupported",
        getattr(nvml, "NVML_ERROR_NO_PERMISSION", 4): "permission",
        getattr(nvml, "NVML_ERROR_NOT_FOUND", 6): "vanished",
        getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15): "vanished",
        getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9): "no-device",
        getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12): "no-device",
    }
    reason = codes.get(value, "read-error")
    fixes = {
        "unsupported": "this GPU or driver does not offer it",
        "permission": "the driver refused: run as a user allowed to query the GPU",
        "vanished": "the GPU fell off the bus or was removed: check `nvidia-smi` and dmesg",
        "no-device": _NO_DRIVER_FIX,
        "read-error": "check `nvidia-smi`",
    }
    return ReadError(reason, f"NVML {what}: {error}; {fixes[reason]}")


# What an NvmlGpu reads, best first: the total-energy counter (mJ since driver load), the
# instantaneous power field (mW), or nvmlDeviceGetPowerUsage (mW). The last is a trailing
# 1-second average on Ampere (except GA100) and newer, so integrating it lags every change of
# load by ~0.5 s: on H200s it read 6.5-7.8 % low over 6-s matmul windows that opened on an idle
# GPU, where the instantaneous field came within 1.2 % of the counter (docs/benchmarks.md).
# It is instantaneous only on GA100 and older, so it is the fallback for drivers without the
# field (before ~R535).
NvmlReading = Literal["energy_counter", "instant_power", "power_usage"]

_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


class NvmlGpu(EnergySource):
    """One GPU: the energy counter, else power readings that the Meter integrates.

    `reading` picks which (see NvmlReading); discovery picks the best the GPU offers.
    """

    domain = "gpu"
    # Counter and power readings refresh every ~100 ms on an H200 (docs/benchmarks.md).
    update_period_s = 0.1

    def __init__(
        self,
        nvml: ModuleType,
        handle: Any,
        uuid: str,
        gpu_name: str,
        power_limit_w: float | None,
        reading: NvmlReading,
    ) -> None:
        nvml.nvmlInit()  # NVML counts inits: this source holds one until close()
        self._nvml: ModuleType | None = nvml
        self._handle = handle
        self.uuid = uuid
        self.gpu_name = gpu_name
        self.power_limit_w = power_limit_w
        self.reading: NvmlReading = reading
        self.name = f"nvml:{uuid}"
        self.method = "counter" if reading == "energy_counter" else "integrated"
        self.reads = "energy_j" if reading == "energy_counter" else "power_w"
        # Power readings are integrated, so the sampler reads them at their update rate (a call
        # costs ~10 us). The counter steps every ~100 ms: the sampler reads it once just after
        # each refresh (power/track.py's RefreshClock) and windows are attributed between
        # refreshes; here sample_period_s is only the spacing of trace points.
        self.sample_period_s = 1.0 if reading == "energy_counter" else 0.1
        self.steps = reading == "energy_counter"
        self.edge_reads = not self.steps  # a power reading is cheap; the counter is not

    def read(self) -> float:
        nvml = self._nvml
        if nvml is None:
            raise ReadError("read-error", f"{self.name} was closed")
        try:
            if self.reading == "energy_counter":
                return nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1000.0
            if self.reading == "instant_power":
                return _instant_power_mw(nvml, self._handle) / 1000.0
            return nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
        except nvml.NVMLError as error:
            raise _translate(nvml, error, f"reading {self.name}") from error

    def process_ids(self) -> tuple[int, ...]:
        """The processes that hold a context on this GPU (compute and graphics), by pid as NVML
        sees them (in a container, possibly the host's pids)."""
        nvml = self._nvml
        if nvml is None:
            raise ReadError("read-error", f"{self.name} was closed")
        try:
            running = [
                *nvml.nvmlDeviceGetComputeRunningProcesses(self._handle),
                *nvml.nvmlDeviceGetGraphicsRunningProcesses(self._handle),
            ]
        except nvml.NVMLError as error:
            raise _translate(nvml, error, f"listing the processes on {self.name}") from error
        return tuple(sorted({int(process.pid) for process in running}))

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml = None

    def describe(self) -> str:
        limit = f"{self.power_limit_w:g} W limit" if self.power_limit_w else "limit unknown"
        how = {
            "energy_counter": "energy counter",
            "instant_power": "instantaneous power, integrated",
            "power_usage": "power usage, integrated",
        }[self.reading]
        return f"{self.gpu_name}, {limit}, {how}"


def _instant_power_mw(nvml: ModuleType, handle: Any) -> float:
    """The NVML_FI_DEV_POWER_INSTANT field; a field's own error is raised as an NVMLError."""
    (field,) = nvml.nvmlDeviceGetFieldValues(handle, [nvml.NVML_FI_DEV_POWER_INSTANT])
    if field.nvmlReturn != nvml.NVML_SUCCESS:
        raise nvml.NVMLError(field.nvmlReturn)
    # The value is a C union; valueType says which member holds it (mW as unsigned int today).
    return float(getattr(field.value, _VALUE_MEMBERS[field.valueType]))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value  # old pynvml returns bytes


def _bare_uuid(uuid: str) -> str:
    return uuid.lower().removeprefix("gpu-")


def _matching_indices(uuids: list[str], entry: str) -> list[int]:
    if entry.lstrip("-").isdigit():
        return [int(entry)] if 0 <= int(entry) < len(uuids) else []
    prefix = _bare_uuid(entry)
    if not prefix:
        return []
    return [index for index, uuid in enumerate(uuids) if _bare_uuid(uuid).startswith(prefix)]


def select_visible(uuids: list[str], visible: str | None) -> tuple[list[int], list[SourceStatus]]:
    """NVML indices that CUDA_VISIBLE_DEVICES lets CUDA use, and statuses for bad entries.

    Like CUDA, entries are indices or (prefixes of) UUIDs with or without "GPU-", and the
    first entry that names no GPU ends the list. Indices follow NVML's PCI order, which is
    CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID (and its default order on one-model machines).
    """
    if visible is None:
        return list(range(len(uuids))), []
    selected: list[int] = []
    entries = [part.strip() for part in visible.split(",")] if visible.strip() else []
    for entry in entries:  # an empty value hides every GPU (the caller says so)
        if entry.upper().startswith("MIG-"):
            detail = f"CUDA_VISIBLE_DEVICES names a MIG instance ({entry}): NVML energy is per "
            detail += "physical GPU, so MIG instances cannot be measured; name whole GPUs"
            return selected, [unavailable(f"nvml:{entry}", "gpu", "counter", "unsupported", detail)]
        matches = _matching_indices(uuids, entry)
        if len(matches) != 1:
            detail = f"CUDA_VISIBLE_DEVICES entry {entry!r} names no single GPU of {len(uuids)}"
            detail += "; CUDA ignores it and every entry after it"
            return selected, [unavailable(f"nvml:{entry}", "gpu", "counter", "no-device", detail)]
        if matches[0] not in selected:  # a GPU named twice is still measured once
            selected.append(matches[0])
    return selected, []


def discover_nvml(visible_devices: str | None, gpus: GpuSelection = "all") -> Discovery:
    """The GPUs that `visible_devices` (CUDA_VISIBLE_DEVICES's value; None: all) names, probed.

    `gpus` picks which of them are read: CUDA indices into that list (the engine's devices), or
    "all". The others are listed in the coverage as out of scope and never read. Without
    nvidia-ml-py, a driver or a GPU this returns a status saying so, never raises.
    """
    try:
        import pynvml
    except ImportError:
        detail = "the nvidia-ml-py package is not installed: `pip install nvidia-ml-py`"
        status = unavailable("nvml", "gpu", "counter", "unsupported", detail)
        return _nvml_failed(status, gpus)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        problem = _translate(pynvml, error, "start")
        status = unavailable("nvml", "gpu", "counter", problem.reason, problem.detail)
        return _nvml_failed(status, gpus)
    try:
        return _discover_devices(pynvml, visible_devices, gpus)
    except pynvml.NVMLError as error:
        problem = _translate(pynvml, error, "listing GPUs")
        status = unavailable("nvml", "gpu", "counter", problem.reason, problem.detail)
        return _nvml_failed(status, gpus)
    finally:
        pynvml.nvmlShutdown()  # the sources took their own references


def _nvml_failed(status: SourceStatus, gpus: GpuSelection) -> Discovery:
    """NVML as a whole is unusable. The GPUs it would have read are missing, unless none was
    wanted, or "all" of them are none (no driver, no device: CUDA sees no GPU either)."""
    wanted = status.reason != "no-device" if gpus == "all" else bool(gpus)
    coverage = Coverage((status.name,), (), {status.name: status.reason or "unknown"})
    return Discovery((), (status,), coverage if wanted else Coverage())


def _discover_devices(
    nvml: ModuleType, visible_devices: str | None, gpus: GpuSelection
) -> Discovery:
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    uuids = [_uuid_name(nvml.nvmlDeviceGetUUID(handle)) for handle in handles]
    if not handles:
        detail = "NVML runs but sees no GPU: check `nvidia-smi`"
        return _nvml_failed(unavailable("nvml", "gpu", "counter", "no-device", detail), gpus)
    visible, problems = select_visible(uuids, visible_devices)
    if not visible and not problems:
        detail = "CUDA_VISIBLE_DEVICES is empty: it hides every GPU from CUDA"
        problems = [unavailable("nvml", "gpu", "counter", "no-device", detail)]
    chosen, unreachable = _choose(visible, problems, gpus)
    candidates: list[EnergySource] = []
    for index in chosen:  # only these GPUs are asked anything beyond their UUID
        handle = handles[index]
        candidates.append(
            NvmlGpu(
                nvml,
                handle,
                uuid=uuids[index],
                gpu_name=_text(nvml.nvmlDeviceGetName(handle)),
                power_limit_w=_power_limit_w(nvml, handle),
                reading=_best_reading(nvml, handle),
            )
        )
    found = Discovery.of(candidates, problems)
    chosen_statuses = found.statuses[: len(chosen)]  # Discovery.of keeps candidates first
    missing = {s.name: s.reason or "unknown" for s in chosen_statuses if not s.available}
    coverage = Coverage(
        in_scope=tuple(f"nvml:{uuids[index]}" for index in chosen) + tuple(unreachable),
        out_of_scope=tuple(f"nvml:{uuids[index]}" for index in visible if index not in chosen),
        missing=missing | unreachable,
    )
    return Discovery(found.sources, found.statuses, coverage)


def _choose(
    visible: list[int], problems: list[SourceStatus], gpus: GpuSelection
) -> tuple[list[int], dict[str, str]]:
    """The NVML indices of the selected GPUs, and the selected ones NVML cannot reach (name ->
    reason): a CUDA index past the visible list, or a MIG instance that CUDA would use."""
    if gpus == "all":
        # A MIG instance is a device CUDA uses that NVML cannot measure; entries naming no GPU
        # (no-device) are ones CUDA ignores.
        return visible, {p.name: p.reason or "unknown" for p in problems if p.reason != "no-device"}
    chosen: list[int] = []
    unreachable: dict[str, str] = {}
    for cuda_index in dict.fromkeys(gpus):  # a device named twice is measured once
        if 0 <= cuda_index < len(visible):
            chosen.append(visible[cuda_index])
        elif problems:  # the entry that ended CUDA's list stands where this device would be
            unreachable[problems[0].name] = problems[0].reason or "unknown"
        else:
            unreachable[f"nvml:cuda:{cuda_index}"] = "no-device"
    return chosen, unreachable


def _uuid_name(uuid: str | bytes) -> str:
    """NVML's UUID as source names carry it, with the "GPU-" prefix."""
    text = _text(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def _best_reading(nvml: ModuleType, handle: Any) -> NvmlReading:
    """Volta and newer keep a total-energy counter; older GPUs only report power."""
    try:
        nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        return "energy_counter"
    except nvml.NVMLError as error:
        if _translate(nvml, error, "").reason != "unsupported":
            return "energy_counter"  # kept: its probe will report what went wrong
    return "instant_power" if has_instant_power(nvml, handle) else "power_usage"


def has_instant_power(nvml: ModuleType, handle: Any) -> bool:
    """Whether the driver and the pynvml module offer the instantaneous power field."""
    if not hasattr(nvml, "NVML_FI_DEV_POWER_INSTANT"):
        return False  # nvidia-ml-py older than the field
    try:
        _instant_power_mw(nvml, handle)
    except (nvml.NVMLError, IndexError):
        # IndexError: a value type this module does not know; the plain reading still works.
        return False
    return True


def _power_limit_w(nvml: ModuleType, handle: Any) -> float | None:
    try:
        return nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
    except nvml.NVMLError:
        return None  # the limit is descriptive only; unknown stays None
