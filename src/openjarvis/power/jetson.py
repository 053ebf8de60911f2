"""NVIDIA Jetson power rails: the INA3221 monitors' voltage and current in sysfs, integrated.

Two layouts: the mainline hwmon driver (JetPack 5 and 6: in<N>_label, in<N>_input in mV,
curr<N>_input in mA) and the older L4T iio driver (JetPack 4: rail_name_<N>, in_power<N>_input
in mW). Not run on a Jetson by this project yet: tested against fake sysfs trees of both.
"""

import os
import re
from pathlib import Path

from openjarvis.power.rapl import SYSFS_ROOT_ENV
from openjarvis.power.sources import Discovery, EnergySource, ReadError, unavailable
from openjarvis.power.sysfs import read_sysfs
from openjarvis.power.types import Coverage, Domain

__all__ = ["JetsonRail", "discover_jetson", "rail_domain"]

_PERMISSION_FIX = (
    "the INA3221 files are readable by root only here: run `sudo chmod o+r {path}` or measure "
    "as a user allowed to read them"
)


def rail_domain(label: str) -> Domain:
    """Where a rail's power goes, from its label: a rail with the GPU on it counts as the GPU
    (VDD_GPU_SOC, VDD_CPU_GPU_CV), the CPU's as the CPU, memory's as DRAM; the module's input
    (VDD_IN, POM_5V_IN) and the SoC's other rails are platform-wide and never added."""
    upper = label.upper()
    if "GPU" in upper:
        return "gpu"
    if "CPU" in upper:
        return "cpu"
    if any(part in upper for part in ("DDR", "VDDQ", "VDDRQ", "DRAM")):
        return "dram"
    return "platform"


class JetsonRail(EnergySource):
    """One INA3221 channel's power in watts (voltage x current, or the driver's power file)."""

    method = "integrated"
    reads = "power_w"
    # The INA3221's conversions average over ~1-10 ms depending on the board's settings: 10 ms
    # is taken here (an assumption, not measured: no Jetson here). Sampled every 50 ms.
    update_period_s = 0.01
    sample_period_s = 0.05

    def __init__(
        self, label: str, voltage: Path | None, current: Path | None, power: Path | None
    ) -> None:
        self.label = label
        self.name = f"jetson:{label}"
        self.domain = rail_domain(label)
        self._voltage, self._current, self._power = voltage, current, power

    def read(self) -> float:
        if self._power is not None:
            return _read_number(self._power) / 1000.0  # mW
        assert self._voltage is not None and self._current is not None
        # Two files read a few microseconds apart: their product is the power at about then.
        return _read_number(self._voltage) * _read_number(self._current) / 1e6  # mV x mA

    def describe(self) -> str:
        where = {"platform": "platform-wide, never added"}.get(self.domain, self.domain)
        return f"INA3221 rail {self.label} ({where})"


def _read_number(path: Path) -> float:
    text = read_sysfs(path, _PERMISSION_FIX.format(path=path))
    try:
        return float(text)
    except ValueError as error:
        raise ReadError("read-error", f"{path} does not hold a number: {text[:40]!r}") from error


def _hwmon_rails(drivers: Path) -> list[JetsonRail]:
    """Mainline ina3221: .../ina3221/<bus>-<address>/hwmon/hwmon<M>/in<N>_label."""
    rails = []
    for label_file in sorted(drivers.glob("ina3221/*/hwmon/hwmon*/in*_label")):
        match = re.fullmatch(r"in(\d+)_label", label_file.name)
        channel = match.group(1) if match else None
        current = label_file.parent / f"curr{channel}_input"
        if channel is None or not current.exists():
            continue  # the sum channel (in7 on Orin) has a label but no current of its own
        label = label_file.read_text().strip()
        rails.append(JetsonRail(label, label_file.parent / f"in{channel}_input", current, None))
    return rails


def _iio_rails(drivers: Path) -> list[JetsonRail]:
    """L4T ina3221x: .../ina3221x/<bus>-<address>/iio:device<M>/rail_name_<N>."""
    rails = []
    for name_file in sorted(drivers.glob("ina3221x/*/iio:device*/rail_name_*")):
        channel = name_file.name.removeprefix("rail_name_")
        label = name_file.read_text().strip()
        power = name_file.parent / f"in_power{channel}_input"
        rails.append(JetsonRail(label, None, None, power))
    return rails


def discover_jetson(sysfs_root: str | Path | None = None) -> Discovery:
    """The INA3221 rails under /sys/bus/i2c/drivers (or $OPENJARVIS_SYSFS_ROOT), probed."""
    root = Path(sysfs_root or os.environ.get(SYSFS_ROOT_ENV) or "/sys")
    drivers = root / "bus" / "i2c" / "drivers"
    try:
        rails = _hwmon_rails(drivers) + _iio_rails(drivers)
    except OSError as error:
        detail = f"cannot list the INA3221 rails under {drivers}: {error}"
        status = unavailable("jetson", "platform", "integrated", "read-error", detail)
        return Discovery((), (status,), Coverage())
    if not rails:
        detail = f"no INA3221 power monitor under {drivers} (NVIDIA Jetson boards have one)"
        status = unavailable("jetson", "platform", "integrated", "no-device", detail)
        return Discovery((), (status,), Coverage())
    seen: set[str] = set()
    for index, rail in enumerate(rails):  # two monitors may label a channel alike
        if rail.name in seen:
            rail.name = f"{rail.name}-{index}"
        seen.add(rail.name)
    return Discovery.of(list(rails), [])
