"""`/test`: the project's own test command, found from its files or set by the user, run in the
working directory inside an energy window; failures are picked out to offer to the model.

The user typing `/test` is the approval, as for a command the model asked to run (tui/shell.py).
"""

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from openjarvis.tui.energy import AssistantMeter, ReplyEnergy
from openjarvis.tui.shell import ShellResult, run_command

__all__ = ["TEST_TIMEOUT_S", "TestRun", "detect_test_command", "failure_lines", "run_tests"]

TEST_TIMEOUT_S = 600.0
_PYTHON_MARKERS = ("pytest.ini", "pyproject.toml", "setup.cfg", "setup.py", "tox.ini")
# Lines that name a failure in the common runners' output: pytest, npm's (jest, mocha, node
# --test), cargo test and go test.
_FAILURE_MARKS = ("FAILED ", "ERROR ", "✕", "failing", "not ok ", "panicked at", "--- FAIL")
_MAX_FAILURE_LINES = 20


def detect_test_command(root: Path) -> tuple[str | None, str]:
    """The test command this project's files point to, and what pointed to it (or why none
    was found). Python uses the project's own virtual environment when it has one."""
    package = root / "package.json"
    if package.is_file():
        try:
            scripts = json.loads(package.read_text(encoding="utf-8")).get("scripts") or {}
        except (ValueError, OSError, AttributeError):
            scripts = {}
        if "test" in scripts:
            return "npm test", "package.json has a test script"
    if (root / "Cargo.toml").is_file():
        return "cargo test", "Cargo.toml"
    if (root / "go.mod").is_file():
        return "go test ./...", "go.mod"
    marker = next((name for name in _PYTHON_MARKERS if (root / name).is_file()), None)
    python_tests = marker or next(
        (f"{path.relative_to(root)}" for path in _python_test_files(root)), None
    )
    if python_tests is not None:
        python = "python3"
        for venv in (".venv", "venv"):
            if (root / venv / "bin" / "python").is_file():
                python = shlex.quote(f"{venv}/bin/python")
                break
        return f"{python} -m pytest -q", python_tests
    return None, "no package.json test script, Cargo.toml, go.mod or Python tests here"


def _python_test_files(root: Path) -> list[Path]:
    """test_*.py or *_test.py in the project's top folder or its tests/ folder."""
    found: list[Path] = []
    for folder in (root, root / "tests", root / "test"):
        if folder.is_dir():
            found += sorted(folder.glob("test_*.py")) + sorted(folder.glob("*_test.py"))
    return found


@dataclass(frozen=True, slots=True)
class TestRun:
    """One `/test`: what ran, how it ended, what it cost."""

    __test__ = False  # not a pytest test class, whatever its name

    result: ShellResult
    energy: ReplyEnergy

    @property
    def passed(self) -> bool:
        return self.result.exit_code == 0

    @property
    def status(self) -> str:
        if self.result.exit_code is None:
            return f"stopped after {self.result.timeout_s:g} s"
        return "passed" if self.passed else f"failed (exit {self.result.exit_code})"

    def for_model(self) -> str:
        """The failures as a message to the model: the command, its output's end, the ask."""
        return (
            "The project's tests fail. Find the cause in the code and fix it; the output:\n"
            f"{self.result.for_model()}"
        )


def run_tests(command: str, root: Path, meter: AssistantMeter, timeout_s: float) -> TestRun:
    """Run `command` in `root` inside an energy window (slow: call it from a worker)."""
    with meter.window("jarvis /test") as window:
        result = run_command(command, root, timeout_s)
    return TestRun(result, ReplyEnergy.measured(window.result))


def failure_lines(output: str) -> list[str]:
    """The lines of a test run's output that name a failure, in order, at most a screenful."""
    lines = [line.rstrip() for line in output.splitlines()]
    failures = [line for line in lines if any(mark in line for mark in _FAILURE_MARKS)]
    return failures[:_MAX_FAILURE_LINES]
