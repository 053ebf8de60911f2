"""The status bar: model, context use, watts now, the reply's joules and speed, the session's.

`StatusState` is plain data that `LiveStatus` keeps current; `render_status` turns it into the
line, so tests can read it.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

from textual.widgets import Static

from openjarvis.runtime.types import Completion
from openjarvis.tui.conversation import Conversation
from openjarvis.tui.energy import LiveWatts, ReplyEnergy, SessionEnergy, format_joules

__all__ = ["LiveStatus", "StatusBar", "StatusState", "render_status"]


@dataclass(slots=True)
class StatusState:
    model: str = "no model"
    activity: str = "ready"
    context_used: int = 0
    context_exact: bool = False
    context_size: int | None = None
    watts_now: float | None = None
    reply_j: float | None = None
    reply_method: str | None = None
    reply_live: bool = False  # the reply is still streaming: joules so far, from the trace
    reply_tokens: int = 0
    tokens_per_s: float | None = None
    session_j: float = 0.0
    session_estimated: bool = False


def render_status(state: StatusState) -> str:
    """One line; the activity comes second so a narrow terminal still shows it."""
    approximate = "" if state.context_exact else "~"
    size = "?" if state.context_size is None else f"{state.context_size:,}"
    parts = [state.model, state.activity, f"ctx {approximate}{state.context_used:,}/{size}"]
    parts.append("— W" if state.watts_now is None else f"{state.watts_now:.1f} W")
    reply = format_joules(state.reply_j, state.reply_method, named=False)
    if state.reply_live and state.reply_j is not None:
        reply = f"{reply} so far"
    per_token = (
        f"{state.reply_j / state.reply_tokens:.3f} J/tok"
        if state.reply_j is not None and state.reply_tokens
        else "— J/tok"
    )
    speed = "— tok/s" if state.tokens_per_s is None else f"{state.tokens_per_s:.1f} tok/s"
    parts.append(f"reply {reply} · {per_token} · {speed}")
    session_method = "estimate" if state.session_estimated else None
    parts.append(f"session {format_joules(state.session_j, session_method, named=False)}")
    if state.session_estimated or state.reply_method == "estimate":
        parts.append("≈ estimate")
    return " │ ".join(parts)


class LiveStatus:
    """Keeps a `StatusState` current: the watts now and, while a reply streams, its joules so
    far (the live watts integrated) and its speed; the reply's final figures when it ends."""

    def __init__(self, watts: LiveWatts, clock: Callable[[], float] = time.monotonic) -> None:
        self.state = StatusState()
        self._watts = watts
        self._clock = clock
        self._last_tick_s = clock()
        self._chunks = 0  # engine chunks of the streaming reply (about a token each)
        self._first_s: float | None = None  # when its first chunk arrived

    def tick(self) -> None:
        now_s = self._clock()
        # A busy machine delays ticks: integrate over the time that really passed.
        elapsed_s, self._last_tick_s = now_s - self._last_tick_s, now_s
        watts = self._watts.poll()
        state = self.state
        if state.reply_live and watts is not None:
            state.reply_j = (state.reply_j or 0.0) + watts * elapsed_s
            state.reply_method = self._watts.method
        state.watts_now = watts
        if state.reply_live and self._first_s is not None and self._chunks > 1:
            streamed_s = self._clock() - self._first_s
            state.tokens_per_s = (self._chunks - 1) / streamed_s if streamed_s > 0 else None
            state.reply_tokens = self._chunks

    def account(
        self, conversation: Conversation, context_size: int | None, energy: SessionEnergy
    ) -> None:
        """The context's use against the model's size, and the session's joules."""
        state = self.state
        state.context_used = conversation.used_tokens
        state.context_exact = conversation.exact
        state.context_size = context_size
        state.session_j = energy.energy_j
        state.session_estimated = energy.estimated

    def reply_started(self) -> None:
        self._chunks, self._first_s = 0, None
        state = self.state
        state.reply_j, state.reply_method, state.reply_live = None, None, True
        state.tokens_per_s, state.reply_tokens = None, 0

    def reply_streamed(self, pieces: int, time_s: float) -> None:
        self._chunks += pieces
        if self._first_s is None:
            self._first_s = time_s

    def reply_ended(self, energy: ReplyEnergy | None, completion: Completion | None) -> None:
        """Stopped or failed (no completion): the figures so far stay, with the window's
        energy where it was measured."""
        state = self.state
        state.reply_live = False
        if energy is not None:
            state.reply_j, state.reply_method = energy.energy_j, energy.method
        if completion is not None:
            state.reply_tokens = completion.completion_tokens
            state.tokens_per_s = completion.decode_tokens_per_s

    def reply_cleared(self) -> None:
        state = self.state
        state.reply_j, state.reply_tokens, state.tokens_per_s = None, 0, None


class StatusBar(Static):
    _shown = ""

    def show(self, state: StatusState) -> None:
        line = render_status(state)
        if line != self._shown:  # an unchanged line would still cost a repaint
            self._shown = line
            self.update(line)
