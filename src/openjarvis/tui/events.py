"""Messages the app's workers post back to the UI thread.

Workers never touch widgets; they post one of these and the app's handlers do the rest.
"""

from textual.message import Message

from openjarvis.runtime.types import Completion
from openjarvis.tui.energy import ReplyEnergy
from openjarvis.tui.engines import LoadedModel
from openjarvis.tui.protocol import ToolCall
from openjarvis.tui.tools import PendingCommand, PendingEdit

__all__ = [
    "ModelFailed",
    "ModelLoaded",
    "ReplyChunk",
    "ReplyDone",
    "ReplyFailed",
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


class ReplyDone(Message):
    def __init__(self, completion: Completion, energy: ReplyEnergy) -> None:
        super().__init__()
        self.completion = completion
        self.energy = energy


class ReplyFailed(Message):
    """The engine refused or the user stopped the reply; energy spent so far, if measured."""

    def __init__(self, error: str, energy: ReplyEnergy | None) -> None:
        super().__init__()
        self.error = error
        self.energy = energy


class ToolFinished(Message):
    def __init__(self, call: ToolCall, title: str, result: str) -> None:
        super().__init__()
        self.call = call
        self.title = title  # one line for the collapsed panel
        self.result = result  # what goes back to the model


class ToolPending(Message):
    """An edit or a command, planned and waiting for the user's approval."""

    def __init__(self, pending: PendingEdit | PendingCommand) -> None:
        super().__init__()
        self.pending = pending
