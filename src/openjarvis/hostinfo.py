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


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else what the platform module knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_host(gpus: tuple[str, ...] = (), gpu_driver: str | None = None) -> HostRecord:
    """This machine as a HostRecord. GPUs come from the power meter's NVML source."""
    model = cpu_model()
    physical_cores = psutil.cpu_count(logical=False) or 0
    logical_cores = psutil.cpu_count() or 0
    memory_bytes = psutil.virtual_memory().total
    os_name = platform.platform()
    facts = {
        "cpu_model": model,
        "cpu_physical_cores": physical_cores,
        "cpu_logical_cores": logical_cores,
        "memory_bytes": memory_bytes,
        "gpus": list(gpus),
        "gpu_driver": gpu_driver,
        "os": os_name,
    }
    fingerprint = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
    return HostRecord(
        fingerprint=fingerprint,
        hostname=socket.gethostname(),
        cpu_model=model,
        cpu_physical_cores=physical_cores,
        cpu_logical_cores=logical_cores,
        memory_bytes=memory_bytes,
        gpus=tuple(gpus),
        gpu_driver=gpu_driver,
        os=os_name,
    )
