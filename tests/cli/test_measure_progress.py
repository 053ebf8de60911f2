"""What `ipw measure` writes to stderr when stderr is not a terminal (a log, a pipe, CI): a line
when the engine is ready, one plain line per finished task, and an error that is exactly one
line.

Run as a user runs it: `python -m openjarvis` in a subprocess whose stderr is a pipe.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

__all__: list[str] = []


def measure(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    environment.pop("OPENJARVIS_DB", None)
    return subprocess.run(
        [sys.executable, "-m", "openjarvis", "measure", *args, "--db", str(tmp_path / "ipw.db")],
        capture_output=True,
        text=True,
        env=environment,
        timeout=600,
    )


@pytest.mark.e2e
def test_one_line_per_finished_task_on_stderr(tmp_path: Path) -> None:
    done = measure(
        *("--suite", "arithmetic", "--limit", "2", "--idle-seconds", "0", "--json"),
        tmp_path=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["figures"]["tasks"] == 2  # stdout stays JSON only
    ready, *lines = done.stderr.splitlines()
    assert re.fullmatch(
        r"2 task\(s\) to run; engine loaded and idle measured in \d+:\d\d:\d\d", ready
    ), ready
    assert len(lines) == 2, done.stderr
    for number, line in enumerate(lines):
        assert re.fullmatch(
            rf"arithmetic/{number}: [01]/1 sample\(s\) passed · {number + 1}/2 tasks, "
            r"[0-2] passed · \d+:\d\d:\d\d elapsed",
            line,
        ), line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "missing.gguf"], "error: model file not found: missing.gguf"),
        (["--suite", "no-such-suite"], "error: unknown suite 'no-such-suite'"),
    ],
    ids=["missing model", "unknown suite"],
)
def test_an_error_during_the_run_is_exactly_one_line(
    args: list[str], message: str, tmp_path: Path
) -> None:
    done = measure(*args, "--idle-seconds", "0", tmp_path=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, repr(done.stderr)
