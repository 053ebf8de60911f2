"""Shared fixtures for the power tests: a clock moved by hand, and a machine with no hardware.

No test here reads real hardware: GPUs come from tests/fakes/nvml.py and tests/fakes/amdsmi.py,
RAPL from tests/fakes/sysfs.py, Apple Silicon from tests/fakes/apple.py, Jetson rails from
tests/fakes/ina3221.py.
"""

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from openjarvis.cli import power as power_cli
from openjarvis.power import rapl
from tests.fakes.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def no_hardware(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No pynvml, amdsmi or zeus_apple_silicon and an empty sysfs root: discovery sees only
    what a test adds there."""
    for library in ("pynvml", "amdsmi", "zeus_apple_silicon"):
        monkeypatch.setitem(sys.modules, library, None)
    root = tmp_path / "sys"
    (root / "class" / "powercap").mkdir(parents=True)
    monkeypatch.setenv(rapl.SYSFS_ROOT_ENV, str(root))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return root


@pytest.fixture
def power_json() -> Callable[[], dict[str, dict[str, object]]]:
    """Runs `ipw power --json` and returns its statuses by source name."""

    def run() -> dict[str, dict[str, object]]:
        app = typer.Typer()
        app.command("power")(power_cli.power_command)
        app.command("other")(lambda: None)  # two commands, so "power" is a subcommand
        result = CliRunner().invoke(app, ["power", "--json"])
        assert result.exit_code == 0, result.output
        return {status["name"]: status for status in json.loads(result.output)["sources"]}

    return run
