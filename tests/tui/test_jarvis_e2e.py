"""`jarvis` end to end in a real terminal (tmux): the embedded model answers, the screen shows
the streamed reply and its joules; `/test` on a project with a failing test shows the failure,
its joules and the offer to hand it to the model. Skips without tmux locally; fails without it
in CI."""

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from openjarvis.runtime.models import DEFAULT_MODEL_NAME

pytestmark = pytest.mark.e2e

SESSION = f"jarvis-e2e-{os.getpid()}"
QUESTION = "What is a Python list? Answer in one sentence."
REPLY_JOULES = re.compile(r"reply ≈?([0-9][0-9,]*\.[0-9]+) J")


def tmux(*args: str) -> str:
    done = subprocess.run(["tmux", *args], capture_output=True, text=True, check=True)
    return done.stdout


@contextmanager
def jarvis_in_tmux(session: str, project: Path, data: Path, rows: int) -> Iterator[None]:
    """`jarvis` started in `project` in a 160-column pane; the session ends on exit."""
    if shutil.which("tmux") is None:
        reason = "tmux is not installed (apt-get install tmux)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI must run the jarvis end-to-end test", pytrace=False)
        pytest.skip(reason)
    launch = "from openjarvis.cli.jarvis import main; main()"
    environment = {"XDG_DATA_HOME": str(data), "TERM": "xterm-256color", "PYTHONUNBUFFERED": "1"}
    exports = " ".join(f"{key}={value}" for key, value in environment.items())
    # COLUMNS and LINES (pytest's terminal may set them) would override the pane's real size.
    command = (
        f"cd {project} && env -u COLUMNS -u LINES {exports} {sys.executable} -c '{launch}'; "
        "sleep 30"
    )
    tmux("new-session", "-d", "-s", session, "-x", "160", "-y", str(rows), command)
    try:
        yield
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def screen() -> str:
    return tmux("capture-pane", "-p", "-t", SESSION)


def reply_text(screen: str) -> str:
    """The replies' text on a screen: the lines between each reply's header (the model's name)
    and its footer (joules · tokens · speed). A small model may call a tool first: all count."""
    lines = []
    inside = False
    for line in screen.splitlines():
        if line.strip() == DEFAULT_MODEL_NAME:
            inside = True
        elif inside and ((" tokens" in line and " J" in line) or " │ " in line):
            inside = False  # a footer, or the status bar below a reply still streaming
        elif inside:
            lines.append(line.strip())
    return " ".join(lines).replace("(no text)", "").strip()


def wait_for(condition: str, timeout_s: float, check: Callable[[str], bool]) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = screen()
        if check(text):
            return text
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {condition}; the screen:\n{screen()}")


@pytest.fixture
def jarvis_started(tmp_path: Path) -> Iterator[None]:
    project = tmp_path / "project"
    project.mkdir()
    (project / "hello.py").write_text('print("hello")\n')
    with jarvis_in_tmux(SESSION, project, tmp_path / "data", rows=100):
        yield


def test_jarvis_streams_an_answer_from_the_embedded_model_with_its_joules(
    jarvis_started: None,
) -> None:
    loaded = wait_for("the model to load", 180, lambda text: "│ ready" in text)
    # The embedded model is a base model: the app says so once, before the first question.
    assert loaded.count(f"{DEFAULT_MODEL_NAME} is a base model (no chat template)") == 1, loaded
    tmux("send-keys", "-t", SESSION, QUESTION, "Enter")
    streaming = wait_for(
        "the reply to start streaming",
        300,
        lambda text: "replying…" in text and "tok/s" in text and "— tok/s" not in text,
    )
    seen: list[str] = []  # long replies scroll the question and early text off the screen

    def finished_seeing(text: str) -> bool:
        seen.append(text)
        return "│ ready" in text

    finished = wait_for("the reply to finish", 900, finished_seeing)
    assert f"> {QUESTION}" in streaming
    text = max((reply_text(screen) for screen in [streaming, *seen]), key=len)
    assert len(text) > 10, finished
    assert "replying…" in streaming  # it was seen while streaming, before it finished
    joules = REPLY_JOULES.search(finished)
    assert joules is not None, finished
    assert float(joules.group(1).replace(",", "")) > 0
    assert re.search(r"session ≈?[0-9.,]+ J", finished)


FAILING_TEST = "def test_adds():\n    assert 1 + 1 == 3\n\n\ndef test_holds():\n    assert True\n"


@pytest.fixture
def jarvis_on_a_failing_test(tmp_path: Path) -> Iterator[None]:
    project = tmp_path / "project"
    (project / ".venv" / "bin").mkdir(parents=True)
    (project / "test_math.py").write_text(FAILING_TEST)
    # The project's own interpreter, as `/test` looks for it: here, one that has pytest.
    python = project / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    with jarvis_in_tmux(SESSION, project, tmp_path / "data", rows=60):
        yield


def test_slash_test_shows_the_failure_its_joules_and_offers_it_to_the_model(
    jarvis_on_a_failing_test: None,
) -> None:
    wait_for("the model to load", 180, lambda text: "│ ready" in text)
    tmux("send-keys", "-t", SESSION, "/test", "Enter")
    shown = wait_for("the failures", 120, lambda text: "Send the failures to the model?" in text)
    # Found from the project: its own interpreter, because of its test file.
    assert "Running .venv/bin/python -m pytest -q (test_math.py)" in shown
    assert "FAILED test_math.py::test_adds" in shown
    assert "test_holds" not in shown.split("FAILED", 1)[1]  # only the failure is offered
    assert re.search(r"failed \(exit 1\) · ≈?[0-9][0-9,]*\.[0-9]+ J", shown), shown
    assert "Tests failed (exit 1)" in shown
