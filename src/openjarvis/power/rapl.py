"""RAPL energy counters read from the Linux powercap sysfs class (Intel and AMD).

Sources: each socket's package zone, each DRAM zone, and psys on its own; never core/uncore.
"""

import os
import re
from pathlib import Path

from openjarvis.power.sources import Discovery, EnergySource, ReadError, unavailable
from openjarvis.power.sysfs import read_sysfs
from openjarvis.power.types import Domain, SourceStatus

__all__ = [
    "MAX_ZONE_POWER_W",
    "SYSFS_ROOT_ENV",
    "RaplZone",
    "discover_rapl",
    "powercap_dir",
]

SYSFS_ROOT_ENV = "OPENJARVIS_SYSFS_ROOT"  # replaces "/sys", so tests can point at a fake tree

# A deliberately generous ceiling on one zone's power: the largest server sockets today are
# rated ~500 W. A counter of range R joules cannot wrap twice between reads less than
# R / MAX_ZONE_POWER_W seconds apart, so that is the longest gap the Meter may leave.
MAX_ZONE_POWER_W = 1000.0

# Zones are directories such as intel-rapl:0 (a socket) and intel-rapl:0:2 (inside it);
# intel-rapl-mmio:0 is a second interface to the same package counter on some laptops.
_ZONE_PATTERN = re.compile(r"^(?P<prefix>[a-z-]*rapl[a-z-]*):(?P<path>\d+(?::\d+)*)$")

_PERMISSION_FIX = (
    "energy_uj is readable by root only on current kernels: run "
    "`sudo chmod o+r {glob}` (until reboot) or add a udev rule "
    '`ACTION=="add", SUBSYSTEM=="powercap", RUN+="/bin/chmod o+r /sys%p/energy_uj"`'
)


def powercap_dir(sysfs_root: str | Path | None = None) -> Path:
    """/sys/class/powercap, with /sys replaced by `sysfs_root` or $OPENJARVIS_SYSFS_ROOT."""
    root = sysfs_root or os.environ.get(SYSFS_ROOT_ENV) or "/sys"
    return Path(root) / "class" / "powercap"


class RaplZone(EnergySource):
    """One powercap zone's energy_uj counter, in joules; it wraps at max_energy_range_uj."""

    method = "counter"
    reads = "energy_j"
    update_period_s = 0.001  # RAPL refreshes about every millisecond
    sample_period_s = 0.1  # one small file read: cheap, but no need for more

    def __init__(self, name: str, domain: Domain, zone_dir: Path, wrap_j: float) -> None:
        self.name = name
        self.domain = domain
        self.zone_dir = zone_dir
        self.wrap_j = wrap_j
        self.max_read_interval_s = wrap_j / MAX_ZONE_POWER_W
        # Built once: joining the path took a third of each read (ten reads a second per zone).
        self._energy_path = zone_dir / "energy_uj"

    def read(self) -> float:
        return _read_int(self._energy_path) / 1e6

    def describe(self) -> str:
        return f"{self.zone_dir.name}, wraps every {self.wrap_j:.0f} J"


def _read_int(path: Path) -> int:
    glob = str(path.parent.parent / f"{path.parent.name.split(':')[0]}:*" / path.name)
    text = read_sysfs(path, _PERMISSION_FIX.format(glob=glob))
    try:
        return int(text)
    except ValueError as error:
        raise ReadError("read-error", f"{path} does not hold an integer: {text[:40]!r}") from error


def _zone_key(zone_dir: Path) -> tuple[bool, str, tuple[int, ...]]:
    match = _ZONE_PATTERN.match(zone_dir.name)
    assert match is not None
    indices = tuple(int(part) for part in match["path"].split(":"))
    # The MSR interface (intel-rapl) first, so its zones win over duplicates from other ones.
    return (match["prefix"] != "intel-rapl", match["prefix"], indices)


def _socket_of(zone_dir: Path, top_name: str | None) -> str:
    """The socket number: from the enclosing package's name ("package-1"), else the path."""
    if top_name is not None and top_name.startswith("package-"):
        return top_name.removeprefix("package-")
    return zone_dir.name.split(":")[1]


def discover_rapl(sysfs_root: str | Path | None = None) -> Discovery:
    """Find the package, DRAM and psys zones under the powercap class and probe each."""
    base = powercap_dir(sysfs_root)
    zone_dirs = (
        sorted((p for p in base.iterdir() if _ZONE_PATTERN.match(p.name)), key=_zone_key)
        if base.is_dir()
        else []
    )
    if not zone_dirs:
        detail = (
            f"no RAPL zones under {base}: needs Linux on an Intel or AMD Zen CPU with the "
            "intel_rapl_msr module (`sudo modprobe intel_rapl_msr`); most VMs do not expose it"
        )
        return Discovery((), (unavailable("rapl", "cpu", "counter", "no-device", detail),))

    candidates: list[EnergySource] = []
    extra: list[SourceStatus] = []
    names: dict[str, str] = {}  # zone name -> prefix that claimed it
    top_names: dict[str, str] = {}  # "intel-rapl:0" -> "package-0"
    for zone_dir in zone_dirs:
        prefix, path = zone_dir.name.split(":", 1)
        try:
            zone_name = (zone_dir / "name").read_text().strip()
            wrap_j = _read_int(zone_dir / "max_energy_range_uj") / 1e6
        except (OSError, ReadError) as error:
            if isinstance(error, ReadError):
                reason, detail = error.reason, error.detail
            else:
                reason, detail = "read-error", f"cannot read {zone_dir}: {error}"
            extra.append(unavailable(f"rapl:{zone_dir.name}", "cpu", "counter", reason, detail))
            continue
        is_top = ":" not in path
        if is_top:
            top_names[zone_dir.name] = zone_name
        top_name = top_names.get(f"{prefix}:{path.split(':')[0]}")
        source = _source_for(zone_name, is_top, zone_dir, top_name, wrap_j)
        if source is None:
            continue  # core, uncore, gpu: inside the package zone, never added to it
        if source.name in names:
            if names[source.name] != prefix:
                continue  # the same counter through a second interface (intel-rapl-mmio)
            source.name = f"{source.name}-{path.replace(':', '-')}"
        names[source.name] = prefix
        candidates.append(source)
    return Discovery.of(candidates, extra)


def _source_for(
    zone_name: str, is_top: bool, zone_dir: Path, top_name: str | None, wrap_j: float
) -> RaplZone | None:
    if is_top and zone_name.startswith("package-"):
        return RaplZone(f"rapl:{zone_name}", "cpu", zone_dir, wrap_j)
    if zone_name == "psys":
        # Platform-wide (SoC and more): reported on its own, never added to packages.
        return RaplZone("rapl:psys", "platform", zone_dir, wrap_j)
    if zone_name == "dram":
        # Servers list DRAM as a child of the package in sysfs, but its energy is a separate
        # domain, not part of the package counter: it is added, unlike core and uncore.
        return RaplZone(f"rapl:dram-{_socket_of(zone_dir, top_name)}", "dram", zone_dir, wrap_j)
    return None
