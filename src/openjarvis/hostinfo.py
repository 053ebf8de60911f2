"""A description of this machine for the results store: CPU, memory, GPUs, driver, OS.

The fingerprint hashes the hardware and OS, not the hostname, so it stays stable across renames.
"""

import hashlib
import json
import platform
import socket
from pathlib import Path

import psutil

from openjarvis.store.records import HostRecord

__all__ = ["cpu_model", "describe_host"]


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's marketing name from /proc/cpuinfo, else what the platform module knows.

    The one reader of the CPU's name outside power/ (power.estimate.cpu_model_name could call
    it); its result is hashed into host fingerprints, so its fallbacks must not change.
    """
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_host(gpus: tuple[str, ...] = (), gpu_driver: str | None = None) -> HostRecord:
    """This machine as a HostRecord. GPUs come from the power meter's NVML source."""
    model = cpu_model()
    physical_cores = psutil.cpu_count(logical=False)  # None when the OS cannot tell
    logical_cores = psutil.cpu_count()
    memory_bytes = psutil.virtual_memory().total
    os_name = platform.platform()
    facts: dict[str, object] = {
        "cpu_model": model,
        "memory_bytes": memory_bytes,
        "gpus": list(gpus),
        "gpu_driver": gpu_driver,  # hashed even when None, as it always was
        "os": os_name,
    }
    # An unknown core count is left out of the hash rather than hashed as a made-up number;
    # a known one is hashed as before, so known hosts keep their fingerprints.
    if physical_cores is not None:
        facts["cpu_physical_cores"] = physical_cores
    if logical_cores is not None:
        facts["cpu_logical_cores"] = logical_cores
    fingerprint = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
    return HostRecord(
        fingerprint=fingerprint,
        hostname=socket.gethostname(),
        cpu_model=model,
        # The hosts table's core columns are NOT NULL (migration 0001), so an unknown count is
        # still stored as 0 there until a migration lets them hold NULL; the fingerprint above
        # does not depend on it.
        cpu_physical_cores=physical_cores or 0,
        cpu_logical_cores=logical_cores or 0,
        memory_bytes=memory_bytes,
        gpus=tuple(gpus),
        gpu_driver=gpu_driver,
        os=os_name,
    )
