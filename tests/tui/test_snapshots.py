"""Screen snapshots of the assistant's main screens (pytest-textual-snapshot): a finished reply
with the energy status bar, an edit's diff waiting for approval, the context warning.

The figures repeat from run to run: a fixed terminal size, scripted replies on a stepping clock
(so tokens/s is exact) and a meter with fixed joules and watts (fixed_meter.py). After a change
to the screens, look at the report and run `pytest tests/tui --snapshot-update`.
"""

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from openjarvis.tui import AssistantApp
from openjarvis.tui.widgets import ApprovalPrompt, ContextPrompt, HistoryInput
from tests.fakes.clock import FakeClock
from tests.tui.fixed_meter import FixedMeter
from tests.tui.pilot import ask, settle
from tests.tui.scripted import ScriptedEngine
from tests.tui.test_session import LONG
from tests.tui.test_tools import EDIT

SIZE = (150, 32)
STEP_S = 0.05  # each reading of the scripted engine's clock moves it on: 20 tokens/s exactly

SnapCompare = Callable[..., bool]


@pytest.fixture
def project() -> Iterator[Path]:
    """The project folder at a path of fixed length: the system prompt names it, and its length
    (a tmp_path's varies) moves the token counts on screen. A folder of its own (mkdtemp's eight
    random characters), so that two runs at once do not share it."""
    root = Path(tempfile.mkdtemp(prefix="openjarvis-", dir="/tmp"))  # always 24 characters
    folder = root / "project"
    folder.mkdir()
    (folder / "hello.py").write_text('print("hello")\n')
    yield folder
    shutil.rmtree(root, ignore_errors=True)


def scripted(replies: list[str]) -> ScriptedEngine:
    clock = FakeClock()

    def stepping() -> float:
        clock.advance(STEP_S)
        return clock()

    return ScriptedEngine(replies, clock=stepping)


async def until_watts_shown(pilot: Pilot[None], until: Callable[[], bool] | None = None) -> None:
    """Settle (idle, or `until`), then wait for a status tick: before one the bar shows '— W'."""
    app: Any = pilot.app
    app.query_one(HistoryInput).cursor_blink = False
    await settle(pilot, until)
    await settle(pilot, lambda: app.status.watts_now is not None)


def test_a_finished_reply_and_the_energy_status_bar(
    snap_compare: SnapCompare, make_app: Callable[..., AssistantApp]
) -> None:
    reply = "Use **print**:\n\n```python\nprint('hi')\n```\n"
    app = make_app(scripted([reply]), meter=FixedMeter())

    async def run_before(pilot: Pilot[None]) -> None:
        await settle(pilot)
        await ask(pilot, "how do I print?")
        await until_watts_shown(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_an_edit_waits_for_approval_with_its_diff(
    snap_compare: SnapCompare, make_app: Callable[..., AssistantApp]
) -> None:
    app = make_app(scripted([EDIT]), meter=FixedMeter())

    async def run_before(pilot: Pilot[None]) -> None:
        await settle(pilot)
        await ask(pilot, "greet the world")
        await until_watts_shown(pilot, lambda: bool(app.query(ApprovalPrompt)))

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_a_request_beyond_the_context_shows_the_warning(
    snap_compare: SnapCompare, make_app: Callable[..., AssistantApp]
) -> None:
    app = make_app(scripted(["first answer"]), context_tokens=1200, meter=FixedMeter())

    async def run_before(pilot: Pilot[None]) -> None:
        await settle(pilot)
        await ask(pilot, f"first {LONG} {LONG}")
        await settle(pilot)
        await ask(pilot, f"second {LONG} {LONG}")
        await until_watts_shown(pilot, lambda: bool(app.query(ContextPrompt)))

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
