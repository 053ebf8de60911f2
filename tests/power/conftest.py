"""Shared fixtures for the power tests: a clock moved by hand, and a machine with no hardware.

No test here reads real hardware: GPUs come from tests/fakes/nvml.py, RAPL from
tests/fakes/sysfs.py.
"""

import sys
from pathlib import Path

import pytest

from openjarvis.power import rapl
from tests.fakes.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def no_hardware(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No pynvml and an empty sysfs root: discovery sees only what a test adds there."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    root = tmp_path / "sys"
    (root / "class" / "powercap").mkdir(parents=True)
    monkeypatch.setenv(rapl.SYSFS_ROOT_ENV, str(root))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return root
