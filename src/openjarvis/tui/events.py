"""Messages the app's workers post back to the UI thread.

Workers never touch widgets; they post one of these and the app's handlers do the rest.
"""

from textual.message import Message

from openjarvis.tui.engines import LoadedModel
from openjarvis.tui.project_tests import TestRun
from openjarvis.tui.replies import ReplyOutcome
from openjarvis.tui.tooling import ToolOutcome
from openjarvis.tui.tools import PendingCommand, PendingEdit

__all__ = [
    "ModelFailed",
    "ModelLoaded",
    "ReplyChunk",
    "ReplyEnded",
    "TestsFinished",
    "ToolFinished",
    "ToolPending",
]


class ModelLoaded(Message):
    def __init__(self, model: LoadedModel) -> None:
        super().__init__()
        self.model = model


class ModelFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class ReplyChunk(Message):
    """Streamed text: the engine's pieces since the last ReplyChunk, joined."""

    def __init__(self, text: str, pieces: int, time_s: float) -> None:
        super().__init__()
        self.text = text
        self.pieces = pieces  # engine chunks joined here (about one token each)
        self.time_s = time_s  # time.monotonic() when the first of them arrived


class ReplyEnded(Message):
    """The reply finished, or the engine refused, or the user stopped it."""

    def __init__(self, outcome: ReplyOutcome) -> None:
        super().__init__()
        self.outcome = outcome


class ToolFinished(Message):
    def __init__(self, outcome: ToolOutcome) -> None:
        super().__init__()
        self.outcome = outcome


class ToolPending(Message):
    """An edit or a command, planned and waiting for the user's approval."""

    def __init__(self, pending: PendingEdit | PendingCommand) -> None:
        super().__init__()
        self.pending = pending


class TestsFinished(Message):
    """`/test` ran the project's tests."""

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self, run: TestRun) -> None:
        super().__init__()
        self.run = run
