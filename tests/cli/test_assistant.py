"""Bare `jarvis`: its options, and `--resume` with nothing to resume (one line, exit 2).

The app itself is driven in tests/tui; these run the command line only.
"""

import os
import subprocess
import sys
from pathlib import Path

LAUNCH = "from openjarvis.cli.jarvis import main; main()"


def jarvis(*args: str, cwd: Path, data_home: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "XDG_DATA_HOME": str(data_home)}
    return subprocess.run(
        [sys.executable, "-c", LAUNCH, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_help_shows_the_assistant_options(tmp_path: Path) -> None:
    done = jarvis("--help", cwd=tmp_path, data_home=tmp_path / "data")
    assert done.returncode == 0, done.stderr
    for option in ("--resume", "--model", "--db", "serve"):
        assert option in done.stdout


def test_resume_without_an_earlier_session_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = jarvis("--resume", cwd=tmp_path, data_home=tmp_path / "data")
    assert done.returncode == 2
    assert done.stderr.startswith("error: no earlier jarvis session in ")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
