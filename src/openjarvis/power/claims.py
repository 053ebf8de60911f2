"""One measurement per energy source at a time: a run claims the sources in its scope, so that a
second measurement on the same machine and devices is told, instead of both claiming its joules.

A claim is an exclusive `flock` on one file per source in a folder every user can write; the
kernel drops it when the process ends, however it ends. The file names who holds it.
"""

import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

__all__ = ["Claim", "claim_sources"]

_FOLDER_MODE = 0o1777  # like /tmp: anyone may add a file, only its owner may remove it


def _folder() -> Path:
    folder = Path(tempfile.gettempdir()) / "openjarvis-meter"
    if not folder.exists():
        folder.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):  # another user made it first, with the same mode
            folder.chmod(_FOLDER_MODE)
    return folder


@dataclass(slots=True)
class Claim:
    """The sources this process holds, and those another measurement holds (with who)."""

    held: list[str] = field(default_factory=list)
    taken: dict[str, str] = field(default_factory=dict)  # source -> "pid 123: ipw measure ..."
    _files: list[IO[str]] = field(default_factory=list, repr=False)

    @property
    def shared(self) -> bool:
        return bool(self.taken)

    def release(self) -> None:
        for handle in self._files:
            handle.close()  # closing drops the lock
        self._files.clear()
        self.held.clear()


def claim_sources(names: Iterable[str], holder: str) -> Claim:
    """Claim each source in `names` for this process; `holder` says what measures (a line)."""
    claim = Claim()
    folder = _folder()
    for name in sorted(set(names)):
        path = folder / (hashlib.sha256(name.encode()).hexdigest()[:24] + ".lock")
        handle = _open(path)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            claim.taken[name] = handle.read().strip() or "another process"
            handle.close()
            continue
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}: {holder}\n")
        handle.flush()
        claim.held.append(name)
        claim._files.append(handle)
    return claim


def _open(path: Path) -> IO[str]:
    """Open (or create, writable by everyone) a lock file for reading and writing."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    with contextlib.suppress(OSError):  # not ours: its owner made it writable when creating it
        os.fchmod(descriptor, 0o666)
    return os.fdopen(descriptor, "r+")
