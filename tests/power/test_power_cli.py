"""`ipw power` over fake hardware: the listing, its JSON, and --watch until Ctrl-C."""

import json
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from openjarvis.cli import power as power_cli
from tests.fakes.sysfs import two_sockets


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()
    app.command("power")(power_cli.power_command)
    app.command("other")(lambda: None)  # two commands, so "power" is a subcommand as in `ipw`
    return app


def test_lists_sources_with_status_and_fix(app: typer.Typer, no_hardware: Path) -> None:
    two_sockets(no_hardware)
    result = CliRunner().invoke(app, ["power"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for text in ["rapl:package-1", "rapl:dram-0", "available", "pip install nvidia-ml-py"]:
        assert text in result.output


def test_json_lists_every_status(app: typer.Typer, no_hardware: Path) -> None:
    two_sockets(no_hardware)
    result = CliRunner().invoke(app, ["power", "--json"])
    assert result.exit_code == 0, result.output
    statuses = {item["name"]: item for item in json.loads(result.output)["sources"]}
    assert statuses["nvml"]["available"] is False
    assert statuses["nvml"]["reason"] == "unsupported"
    assert statuses["rapl:package-0"]["method"] == "counter"
    assert statuses["estimate:cpu"]["reason"] == "superseded"


def test_watch_prints_watts_until_ctrl_c(
    app: typer.Typer, no_hardware: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = two_sockets(no_hardware)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        if len(sleeps) == 2:
            raise KeyboardInterrupt
        sleeps.append(seconds)
        time.sleep(0.02)  # a real interval, well over RAPL's 1 ms update period
        tree.set_energy_uj("intel-rapl:0", 1_000_000_000 * len(sleeps))  # +1000 J per update

    monkeypatch.setattr(power_cli, "sleep", sleep)
    result = CliRunner().invoke(app, ["power", "--watch", "--json", "--interval", "0.5"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert len(lines) == 2 and sleeps == [0.5, 0.5]
    package = lines[1]["sources"]["rapl:package-0"]
    assert package["power_w"] == pytest.approx(1000.0 / lines[1]["duration_s"])


def test_watch_piped_prints_each_update(
    app: typer.Typer, no_hardware: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Piped (not a terminal), a live display would redraw in place and print nothing: each
    update is printed in turn instead, the whole table however wide."""
    tree = two_sockets(no_hardware)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        if len(sleeps) == 2:
            raise KeyboardInterrupt
        sleeps.append(seconds)
        time.sleep(0.02)
        tree.set_energy_uj("intel-rapl:0", 1_000_000_000 * len(sleeps))

    monkeypatch.setattr(power_cli, "sleep", sleep)
    monkeypatch.delenv("COLUMNS", raising=False)
    result = CliRunner().invoke(app, ["power", "--watch", "--interval", "0.5"])
    assert result.exit_code == 0, result.output
    assert result.output.count("Power over the last") == 2
    assert "rapl:package-0" in result.output and "…" not in result.output
