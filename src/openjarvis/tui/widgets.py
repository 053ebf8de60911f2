"""The assistant's widgets: chat entries, tool panels, approval and context prompts, input.

Each prompt posts one `Decided` message; the app decides what follows.
"""

from typing import Any, ClassVar, Literal

from rich.markdown import Markdown as RichMarkdown
from rich.syntax import Syntax
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Collapsible, Input, Markdown, Static

from openjarvis.tui.conversation import ContextCheck
from openjarvis.tui.project_tests import TestRun, failure_lines
from openjarvis.tui.tools import PendingCommand, PendingEdit

__all__ = [
    "ApprovalPrompt",
    "ContextPrompt",
    "FailuresPrompt",
    "HistoryInput",
    "Notice",
    "ReplyView",
    "ToolView",
    "UserLine",
]


class UserLine(Static):
    def __init__(self, text: str) -> None:
        super().__init__(f"[b]>[/b] {text}", markup=True, classes="user")


class Notice(Markdown):
    """A line from the assistant itself (command output, warnings), not from the model."""

    def __init__(self, text: str, warning: bool = False) -> None:
        super().__init__(text, classes="notice warning" if warning else "notice")


class ReplyView(Vertical):
    """One model reply: streamed, then finished with its energy and speed.

    While it streams, the text is one Static rendering Rich's Markdown (code highlighted too);
    Textual's Markdown widget, one child widget per block, cost the UI thread half as much
    again per update (docs/benchmarks.md), so it takes over only when the reply is done.
    """

    def __init__(self, model_name: str) -> None:
        super().__init__(classes="reply")
        self.model_name = model_name
        self.text = ""

    def compose(self) -> ComposeResult:
        yield Static(self.model_name, classes="reply-header")
        yield Static("", classes="reply-live")
        yield Markdown(classes="reply-body")
        yield Static("", classes="reply-footer")

    def write(self, text: str) -> None:
        self.text += text
        self.query_one(".reply-live", Static).update(RichMarkdown(self.text))

    async def finish(self, prose: str, footer: str) -> None:
        """Show the final text (the tool call moves to its own panel) and the reply's figures."""
        await self.query_one(".reply-live", Static).remove()
        await self.query_one(Markdown).update(prose or "*(no text)*")
        self.query_one(".reply-footer", Static).update(footer)


class ToolView(Collapsible):
    """A tool call and its result, collapsed to one line (the result is often long)."""

    def __init__(self, title: str, result: str) -> None:
        body = Static(result, markup=False, classes="tool-result")
        super().__init__(body, title=title, collapsed=True, classes="tool")


Decision = Literal["yes", "no", "always"]


class ApprovalPrompt(Vertical, can_focus=True):
    """Shows a diff or a command and waits for y / n / a."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "decide('yes')", "yes"),
        Binding("n", "decide('no')", "no"),
        Binding("a", "decide('always')", "always this session"),
    ]

    class Decided(Message):
        def __init__(self, prompt: "ApprovalPrompt", decision: Decision) -> None:
            super().__init__()
            self.prompt = prompt
            self.decision = decision

        @property
        def control(self) -> "ApprovalPrompt":
            return self.prompt

    def __init__(self, pending: PendingEdit | PendingCommand) -> None:
        super().__init__(classes="prompt")
        self.pending = pending

    def compose(self) -> ComposeResult:
        pending = self.pending
        if isinstance(pending, PendingEdit):
            verb = "Create" if pending.plan.before is None else "Apply this edit to"
            yield Static(f"[b]{verb} {pending.plan.relative}?[/b]")
            yield Static(Syntax(pending.plan.diff, "diff", theme="ansi_dark", word_wrap=True))
            always = "every edit"
        else:
            yield Static("[b]Run this command in the working directory?[/b]")
            yield Static(Syntax(pending.command, "bash", theme="ansi_dark", word_wrap=True))
            always = "every command"
        yield Static(f"[b]y[/b] yes   [b]n[/b] no   [b]a[/b] yes to {always} this session")

    def action_decide(self, decision: Decision) -> None:
        self.post_message(self.Decided(self, decision))


class ContextPrompt(Vertical, can_focus=True):
    """The request would not fit the model's context: drop old turns, or do not send."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("d", "decide('drop')", "drop old turns"),
        Binding("c", "decide('cancel')", "cancel"),
    ]

    class Decided(Message):
        def __init__(self, prompt: "ContextPrompt", drop: bool) -> None:
            super().__init__()
            self.prompt = prompt
            self.drop = drop

        @property
        def control(self) -> "ContextPrompt":
            return self.prompt

    def __init__(self, check: ContextCheck) -> None:
        super().__init__(classes="prompt warning")
        self.check = check

    def compose(self) -> ComposeResult:
        check = self.check
        yield Static(
            f"[b]This request does not fit the model's context.[/b] It needs about "
            f"{check.needed_tokens:,} tokens ({check.used_tokens:,} of conversation + "
            f"{check.reply_tokens:,} for the reply); the context holds {check.context_tokens:,}."
        )
        if check.droppable_turns:
            yield Static(
                f"Dropping the oldest of {check.droppable_turns} earlier turns (up to "
                f"{check.freed_tokens:,} tokens) would make room; they stay in the session's "
                "history. [b]d[/b] drop and send   [b]c[/b] cancel"
            )
        else:
            yield Static("There are no earlier turns to drop. [b]c[/b] cancel (then shorten it)")

    def action_decide(self, choice: str) -> None:
        if choice == "drop" and not self.check.droppable_turns:
            return
        self.post_message(self.Decided(self, drop=choice == "drop"))


class FailuresPrompt(Vertical, can_focus=True):
    """The project's tests failed: hand the failures to the model, or keep them."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "decide(True)", "send the failures"),
        Binding("n", "decide(False)", "keep them"),
    ]

    class Decided(Message):
        def __init__(self, prompt: "FailuresPrompt", send: bool) -> None:
            super().__init__()
            self.prompt = prompt
            self.send = send

        @property
        def control(self) -> "FailuresPrompt":
            return self.prompt

    def __init__(self, run: TestRun, with_model: bool) -> None:
        super().__init__(classes="prompt")
        self.run = run
        self.with_model = with_model

    def compose(self) -> ComposeResult:
        failures = failure_lines(self.run.result.output)
        shown = "\n".join(failures) or "(no line names a failure: see the output above)"
        yield Static(shown, markup=False)
        if self.with_model:
            yield Static("[b]Send the failures to the model?[/b]   [b]y[/b] yes   [b]n[/b] no")
        else:
            yield Static("No model is loaded to send them to. [b]n[/b] close")

    def action_decide(self, send: bool) -> None:
        if send and not self.with_model:
            return
        self.post_message(self.Decided(self, send))


class HistoryInput(Input):
    """An input line that recalls earlier entries with up and down."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "recall(-1)", "previous", show=False),
        Binding("down", "recall(1)", "next", show=False),
    ]

    def __init__(self, history: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history = list(history or [])
        self._position = len(self.history)

    def remember(self, text: str) -> None:
        if text and (not self.history or self.history[-1] != text):
            self.history.append(text)
        self._position = len(self.history)

    def action_recall(self, step: int) -> None:
        if not self.history:
            return
        self._position = max(0, min(len(self.history), self._position + step))
        self.value = self.history[self._position] if self._position < len(self.history) else ""
        self.cursor_position = len(self.value)

    @on(Input.Submitted)
    def _remember_submitted(self, event: Input.Submitted) -> None:
        self.remember(event.value)
