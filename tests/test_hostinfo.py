"""The host description: known hosts keep their fingerprints; unknown core counts are not hashed."""

import platform
from collections import namedtuple
from pathlib import Path
from unittest import mock

import psutil

from openjarvis import hostinfo
from openjarvis.power.estimate import cpu_model_name
from openjarvis.records import HostRecord

_Memory = namedtuple("_Memory", "total")
_EPYC = "AMD EPYC 9654 96-Core Processor"


def _host(
    cores: dict[bool, int | None], gpus: tuple[str, ...] = (), driver: str | None = None
) -> HostRecord:
    # The hardware edge: what psutil and the platform module report.
    with (
        mock.patch.object(hostinfo, "cpu_model_name", return_value=_EPYC),
        mock.patch.object(psutil, "cpu_count", side_effect=lambda logical=True: cores[logical]),
        mock.patch.object(psutil, "virtual_memory", return_value=_Memory(1 << 40)),
        mock.patch.object(platform, "platform", return_value="Linux-6.8.0-x86_64-with-glibc2.39"),
    ):
        return hostinfo.describe_host(gpus, driver)


def test_known_hosts_keep_the_fingerprints_they_had() -> None:
    # Values computed by the code before unknown counts were left out of the hash.
    known: dict[bool, int | None] = {True: 192, False: 96}
    assert _host(known, ("NVIDIA H200 (GPU-1234)",), "570.86").fingerprint == "dafa77ab19bd3376"
    assert _host(known).fingerprint == "9d301a6d596b0351"


def test_an_unknown_core_count_is_left_out_of_the_fingerprint_not_hashed_as_zero() -> None:
    unknown = _host({True: None, False: None})
    assert unknown.fingerprint != _host({True: 0, False: 0}).fingerprint
    assert unknown.fingerprint != _host({True: 192, False: 96}).fingerprint
    assert (unknown.cpu_physical_cores, unknown.cpu_logical_cores) == (None, None)  # not 0


def test_cpu_model_reads_the_model_name_line(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: {_EPYC}\nflags\t: sse avx\n")
    assert cpu_model_name(cpuinfo) == _EPYC
    assert cpu_model_name(tmp_path / "missing") != ""  # the platform module's answer
