"""Ctrl-C with tasks in flight (`--concurrency 4`, the embedded model): the first says at once
that the tasks in flight are finishing, and a second stops at once, naming the run and how to
continue it."""

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.signals import default_sigint

pytestmark = pytest.mark.e2e


def _lines(stream: Iterable[str], into: "queue.Queue[str]") -> None:
    for line in stream:  # a text pipe
        into.put(line.rstrip("\n"))


def _wait_for(lines: "queue.Queue[str]", text: str, timeout_s: float, seen: list[str]) -> float:
    """Seconds until a stderr line holds `text`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            continue
        seen.append(line)
        if text in line:
            return time.monotonic() - start
    raise AssertionError(f"no line with {text!r} within {timeout_s} s: {seen[-5:]}")


def test_ctrl_c_with_tasks_in_flight_answers_at_once_and_a_second_stops(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    # --allow-shared: another measurement on this machine must not refuse the test's run.
    command = ["measure", "--limit", "8", "--concurrency", "4", "--idle-seconds", "1"]
    process = subprocess.Popen(
        [sys.executable, "-m", "openjarvis", *command, "--allow-shared", "--db", str(db)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=default_sigint,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(process.stderr, lines), daemon=True).start()
    seen: list[str] = []
    try:
        _wait_for(lines, "task(s) to run", 600, seen)
        # Said just before the workers start: a Ctrl-C at once can find no task generating yet
        # (then nothing is in flight and the run stops at the first). Two seconds in, the first
        # four are generating (in a run here, they took 25 s to finish after a Ctrl-C).
        time.sleep(2.0)
        process.send_signal(signal.SIGINT)
        assert _wait_for(lines, "stopping: the tasks in flight finish generating", 5, seen) < 5
        time.sleep(0.5)
        assert process.poll() is None  # still finishing the tasks in flight
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=15) == 130
    finally:
        if process.poll() is None:
            process.kill()
    _wait_for(lines, "interrupted: stopped at once, run ", 5, seen)
    assert "ipw measure --resume" in seen[-1] and "Traceback" not in "\n".join(seen)
