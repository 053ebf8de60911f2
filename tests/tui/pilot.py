"""Helpers for driving the app in tests: wait until it settles, run a scenario, a git folder."""

import asyncio
import subprocess
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import Input

from openjarvis.tui import AssistantApp

__all__ = ["ask", "init_git", "run", "settle"]


def init_git(folder: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True)

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")


async def settle(pilot: Pilot[None], until: Callable[[], object] | None = None) -> None:
    """Wait until the app is idle (no worker, not busy) or `until` holds (is truthy); 20 s at
    most."""
    app = pilot.app
    assert isinstance(app, AssistantApp)  # the assistant's app is the only one driven here
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        await pilot.pause(0.02)
        busy_workers = any(not worker.is_finished for worker in app.workers)
        done = until() if until is not None else not (app.busy or busy_workers)
        if done:
            await pilot.pause()
            return
    raise AssertionError("the app did not settle within 20 s")


def run(coroutine: Coroutine[Any, Any, None]) -> None:
    """Sync tests run the pilot with asyncio.run (no pytest-asyncio needed)."""
    asyncio.run(coroutine)


async def ask(pilot: Pilot[None], text: str) -> None:
    """Type a line into the prompt and press Enter."""
    pilot.app.query_one("#prompt", Input).value = text
    await pilot.press("enter")
