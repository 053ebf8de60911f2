"""Fake Jetson INA3221 trees under a temp sysfs root, in the kernel's two layouts: the
mainline hwmon driver (in<N>_label, in<N>_input mV, curr<N>_input mA; JetPack 5 and 6) and
L4T's iio driver (rail_name_<N>, in_power<N>_input mW; JetPack 4)."""

from pathlib import Path

__all__ = ["FakeHwmonIna3221", "FakeIioIna3221"]


class FakeHwmonIna3221:
    """An Orin-style monitor at 1-0040 whose channels a test sets in millivolts and milliamps."""

    def __init__(self, sysfs_root: Path, labels: list[str], with_sum_channel: bool = True) -> None:
        self.dir = sysfs_root / "bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3"
        self.dir.mkdir(parents=True)
        for channel, label in enumerate(labels, start=1):
            (self.dir / f"in{channel}_label").write_text(f"{label}\n")
            self.set(channel, 5000, 0)
        if with_sum_channel:  # Orin's sum of shunt voltages: a label without a current
            (self.dir / "in7_label").write_text("sum of shunt voltages\n")
            (self.dir / "in7_input").write_text("0\n")

    def set(self, channel: int, millivolts: int, milliamps: int) -> None:
        (self.dir / f"in{channel}_input").write_text(f"{millivolts}\n")
        (self.dir / f"curr{channel}_input").write_text(f"{milliamps}\n")

    def path(self, name: str) -> Path:
        return self.dir / name


class FakeIioIna3221:
    """A Xavier-style monitor at 1-0040 whose channels a test sets in milliwatts."""

    def __init__(self, sysfs_root: Path, labels: list[str]) -> None:
        self.dir = sysfs_root / "bus/i2c/drivers/ina3221x/1-0040/iio:device0"
        self.dir.mkdir(parents=True)
        for channel, label in enumerate(labels):
            (self.dir / f"rail_name_{channel}").write_text(f"{label}\n")
            self.set(channel, 0)

    def set(self, channel: int, milliwatts: int) -> None:
        (self.dir / f"in_power{channel}_input").write_text(f"{milliwatts}\n")
