"""A description of this machine for the results store: CPU, memory, GPUs, driver, OS.

The fingerprint hashes the hardware and OS, not the hostname, so it stays stable across renames.
"""

import hashlib
import json
import platform
import socket

import psutil

from openjarvis.power.estimate import cpu_model_name
from openjarvis.records import HostRecord

__all__ = ["describe_host"]


def describe_host(gpus: tuple[str, ...] = (), gpu_driver: str | None = None) -> HostRecord:
    """This machine as a HostRecord. GPUs come from the power meter's NVML source."""
    model = cpu_model_name()
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
        cpu_physical_cores=physical_cores,  # None: unknown (stored as NULL since migration 0008)
        cpu_logical_cores=logical_cores,
        memory_bytes=memory_bytes,
        gpus=tuple(gpus),
        gpu_driver=gpu_driver,
        os=os_name,
    )
