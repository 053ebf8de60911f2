"""Reading one small sysfs file (a RAPL counter, an INA3221 channel) with the kernel's errors
translated into ReadError where they enter.
"""

from pathlib import Path

from openjarvis.power.sources import ReadError

__all__ = ["read_sysfs"]


def read_sysfs(path: Path, permission_fix: str) -> bytes:
    """The file's bytes; a ReadError (permission with `permission_fix`, vanished, read-error)
    where the kernel refuses."""
    # Plain open() on purpose: it is the one place the kernel answers, so tests fake the
    # kernel's PermissionError here (root ignores file modes, so chmod cannot fake it).
    try:
        with open(path, "rb") as file:
            return file.read()
    except PermissionError as error:
        raise ReadError("permission", permission_fix) from error
    except FileNotFoundError as error:
        raise ReadError("vanished", f"{path} disappeared (the driver was unloaded)") from error
    except OSError as error:
        raise ReadError("read-error", f"cannot read {path}: {error.strerror}") from error
