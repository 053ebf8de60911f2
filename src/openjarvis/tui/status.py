"""The status bar: model, context use, watts now, the reply's joules and speed, the session's.

`StatusState` is plain data; `render_status` turns it into the line, so tests can read it.
"""

from dataclasses import dataclass

from textual.widgets import Static

from openjarvis.tui.energy import format_joules

__all__ = ["StatusBar", "StatusState", "render_status"]


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


class StatusBar(Static):
    _shown = ""

    def show(self, state: StatusState) -> None:
        line = render_status(state)
        if line != self._shown:  # an unchanged line would still cost a repaint
            self._shown = line
            self.update(line)
