"""Fake powercap sysfs trees in a temp dir, laid out like the kernel's, for the RAPL tests.

Zones live under devices/virtual/powercap and class/powercap holds symlinks to them, as on Linux.
"""

import builtins
import errno
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from openjarvis.power import rapl
from openjarvis.power import sysfs as power_sysfs

__all__ = ["DEFAULT_RANGE_UJ", "FakePowercap", "laptop_with_psys", "one_socket", "two_sockets"]

DEFAULT_RANGE_UJ = 262_143_328_850  # what many Intel packages report


class FakePowercap:
    """A powercap tree whose counters the test sets by hand (microjoules, like the kernel)."""

    def __init__(self, sysfs_root: Path) -> None:
        self.sysfs_root = sysfs_root
        self.class_dir = sysfs_root / "class" / "powercap"
        self.devices_dir = sysfs_root / "devices" / "virtual" / "powercap"
        self.class_dir.mkdir(parents=True, exist_ok=True)
        self._denied: set[Path] = set()

    def _zone_dir(self, zone: str) -> Path:
        prefix, path = zone.split(":", 1)
        parts = path.split(":")
        # intel-rapl:0:2 lives in .../intel-rapl/intel-rapl:0/intel-rapl:0:2
        nested = [f"{prefix}:{':'.join(parts[: depth + 1])}" for depth in range(len(parts))]
        return self.devices_dir.joinpath(prefix, *nested)

    def add_zone(
        self,
        zone: str,
        name: str,
        energy_uj: int = 0,
        max_energy_range_uj: int = DEFAULT_RANGE_UJ,
    ) -> None:
        zone_dir = self._zone_dir(zone)
        zone_dir.mkdir(parents=True)
        (zone_dir / "name").write_text(f"{name}\n")
        (zone_dir / "energy_uj").write_text(f"{energy_uj}\n")
        (zone_dir / "max_energy_range_uj").write_text(f"{max_energy_range_uj}\n")
        (zone_dir / "enabled").write_text("1\n")
        (self.class_dir / zone).symlink_to(zone_dir)

    def set_energy_uj(self, zone: str, energy_uj: int) -> None:
        (self._zone_dir(zone) / "energy_uj").write_text(f"{energy_uj}\n")

    def remove_zone(self, zone: str) -> None:
        """The zone (and its children) disappear, as when the driver is unloaded."""
        shutil.rmtree(self._zone_dir(zone))
        for link in self.class_dir.iterdir():
            if link.name == zone or link.name.startswith(f"{zone}:"):
                link.unlink()

    def deny_read(self, zone: str) -> None:
        """Make energy_uj of `zone` answer EACCES, as the kernel does for non-root users."""
        self._denied.add((self._zone_dir(zone) / "energy_uj").resolve())

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Point OpenJarvis at this tree and fake the kernel's EACCES for denied files.

        Tests run as root here, and root reads a mode-000 file anyway, so chmod cannot make a
        real EACCES. Instead power/sysfs.py's `open` (the one call that reads energy_uj) is
        shadowed by one that raises the kernel's PermissionError, for denied paths only.
        """
        monkeypatch.setenv(rapl.SYSFS_ROOT_ENV, str(self.sysfs_root))
        monkeypatch.setattr(power_sysfs, "open", self._open(builtins.open), raising=False)

    def _open(self, real_open: Callable[..., Any]) -> Callable[..., Any]:
        def fake_open(path: Any, *args: Any, **kwargs: Any) -> Any:
            if Path(path).resolve() in self._denied:
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return real_open(path, *args, **kwargs)

        return fake_open


def one_socket(sysfs_root: Path) -> FakePowercap:
    """A desktop: package-0 with a core zone inside it."""
    tree = FakePowercap(sysfs_root)
    tree.add_zone("intel-rapl:0", "package-0")
    tree.add_zone("intel-rapl:0:0", "core")
    return tree


def two_sockets(sysfs_root: Path) -> FakePowercap:
    """A server: two packages, each with core, uncore and (separately counted) dram inside."""
    tree = FakePowercap(sysfs_root)
    for socket in (0, 1):
        tree.add_zone(f"intel-rapl:{socket}", f"package-{socket}")
        tree.add_zone(f"intel-rapl:{socket}:0", "core")
        tree.add_zone(f"intel-rapl:{socket}:1", "uncore")
        tree.add_zone(f"intel-rapl:{socket}:2", "dram")
    return tree


def laptop_with_psys(sysfs_root: Path) -> FakePowercap:
    """A laptop: package-0 (core, uncore), psys, and the package again through MMIO."""
    tree = FakePowercap(sysfs_root)
    tree.add_zone("intel-rapl:0", "package-0")
    tree.add_zone("intel-rapl:0:0", "core")
    tree.add_zone("intel-rapl:0:1", "uncore")
    tree.add_zone("intel-rapl:1", "psys")
    tree.add_zone("intel-rapl-mmio:0", "package-0")
    return tree
