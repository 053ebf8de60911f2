"""`jarvis` end to end in a real terminal (tmux): the embedded model answers, the screen shows
the streamed reply and its joules. Skips without tmux locally; fails without it in CI."""

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
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
def jarvis_in_tmux(tmp_path: Path) -> Iterator[None]:
    if shutil.which("tmux") is None:
        reason = "tmux is not installed (apt-get install tmux)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI must run the jarvis end-to-end test", pytrace=False)
        pytest.skip(reason)
    project = tmp_path / "project"
    project.mkdir()
    (project / "hello.py").write_text('print("hello")\n')
    launch = "from openjarvis.cli.jarvis import main; main()"
    environment = {
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "TERM": "xterm-256color",
        "PYTHONUNBUFFERED": "1",
    }
    exports = " ".join(f"{key}={value}" for key, value in environment.items())
    # COLUMNS and LINES (pytest's terminal may set them) would override the pane's real size.
    command = (
        f"cd {project} && env -u COLUMNS -u LINES {exports} {sys.executable} -c '{launch}'; "
        "sleep 30"
    )
    tmux("new-session", "-d", "-s", SESSION, "-x", "160", "-y", "100", command)
    try:
        yield
    finally:
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)


def test_jarvis_streams_an_answer_from_the_embedded_model_with_its_joules(
    jarvis_in_tmux: None,
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
