"""The base layer of the `jarvis` app: layout, status bar, loading models, the input line.

Layers above: replies (replies.py), tools (tooling.py), slash commands (app.py). Slow work runs
in thread workers that post messages (events.py) back to the UI.
"""

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Input

from openjarvis.errors import UserError
from openjarvis.power import Meter
from openjarvis.store import Store
from openjarvis.tui.conversation import Conversation, Message, Role
from openjarvis.tui.edits import UndoStack
from openjarvis.tui.energy import LiveWatts, SessionEnergy
from openjarvis.tui.engines import LoadedModel, ModelOpener
from openjarvis.tui.events import ModelFailed, ModelLoaded
from openjarvis.tui.protocol import parse_reply, system_prompt
from openjarvis.tui.session import SessionLog
from openjarvis.tui.status import StatusBar, StatusState
from openjarvis.tui.tools import summary
from openjarvis.tui.widgets import HistoryInput, Notice, ReplyView, UserLine
from openjarvis.tui.workspace import Workspace

__all__ = ["REPLY_TOKENS", "ChatApp"]

REPLY_TOKENS = 1024  # the budget each reply gets, at most a quarter of the context
STATUS_PERIOD_S = 0.5  # twice a second: live, and light on a small machine


class ChatApp(App[None]):
    CSS = """
    #chat { height: 1fr; padding: 0 1; }
    #status { height: 1; background: $panel; color: $text; padding: 0 1; }
    .user { margin: 1 0 0 0; color: $accent; }
    .reply { height: auto; }
    .reply-header { color: $text-muted; }
    .reply-body { margin: 0; }
    .reply-live { padding: 0 2; }
    .reply-footer { color: $text-muted; }
    .notice { color: $text-muted; margin: 0; }
    .warning { color: $warning; }
    .prompt { height: auto; border: round $warning; padding: 0 1; }
    .prompt:focus { border: round $accent; }
    .tool { margin: 0; }
    """
    TITLE = "jarvis"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "stop_reply", "stop the reply"),
        Binding("ctrl+q", "quit"),
    ]

    def __init__(
        self,
        *,
        opener: ModelOpener,
        model_spec: str | None,
        meter: Meter,
        store: Store,
        working_dir: Path,
        resume_session: str | None = None,
        shell_timeout_s: float = 120.0,
        reply_tokens: int = REPLY_TOKENS,
    ) -> None:
        super().__init__()
        self.opener = opener
        self.model: LoadedModel | None = None
        self._initial_spec = model_spec
        self.meter = meter
        self.workspace = Workspace(working_dir)
        self.conversation = Conversation(system_prompt(str(self.workspace.root)))
        self.session_log = SessionLog(store, self.workspace.root, resume_session)
        self.session_energy = SessionEnergy()
        self.undo_stack = UndoStack(self.workspace)
        self.shell_timeout_s = shell_timeout_s
        self._reply_budget = reply_tokens
        self.always: set[str] = set()  # "edit", "run": approved for the rest of the session
        self.status = StatusState()
        self.busy = False
        self.tool_rounds = 0
        self._watts = LiveWatts(meter)
        self._stop_reply = threading.Event()
        self._reply: ReplyView | None = None
        self._reply_chunks = 0
        self._reply_first_s: float | None = None
        self._loading = False
        self._last_tick_s = time.monotonic()
        self._asked_while_loading = False  # a question typed before the model was ready

    def compose(self) -> ComposeResult:
        yield VerticalScroll(id="chat")
        yield StatusBar(id="status", markup=False)
        yield HistoryInput(placeholder="Ask, or /help", id="prompt")

    async def on_mount(self) -> None:
        self.query_one("#chat").anchor()
        if self.session_log.session_id is not None:
            await self._show_resumed()
        self.set_interval(STATUS_PERIOD_S, self._tick)
        self.query_one(HistoryInput).focus()
        self.load_model(self._initial_spec)

    async def _show_resumed(self) -> None:
        self.session_log.load(self.conversation, self.session_energy)
        chat = self.query_one("#chat")
        prompt = self.query_one(HistoryInput)
        for message in self.conversation.messages:
            if message.role == "user":
                prompt.remember(message.content)
                await chat.mount(UserLine(message.content))
            elif message.role == "assistant":
                prose, call = parse_reply(message.content, stopped_at_close=True)
                view = ReplyView("earlier reply")
                await chat.mount(view)
                await view.finish(prose, "" if call is None else f"called {summary(call)}")
        await self.notice(f"Resumed the last session ({len(self.conversation.messages)} messages).")

    # Status --------------------------------------------------------------------------------

    def _tick(self) -> None:
        now_s = time.monotonic()
        # A busy machine delays ticks: integrate over the time that really passed.
        elapsed_s, self._last_tick_s = now_s - self._last_tick_s, now_s
        watts = self._watts.poll()
        state = self.status
        if state.reply_live and watts is not None:
            # Until the window closes, the reply's joules are the live watts integrated.
            state.reply_j = (state.reply_j or 0.0) + watts * elapsed_s
            state.reply_method = self._watts.method
        state.watts_now = watts
        if state.reply_live and self._reply_first_s is not None and self._reply_chunks > 1:
            elapsed_s = time.monotonic() - self._reply_first_s
            state.tokens_per_s = (self._reply_chunks - 1) / elapsed_s if elapsed_s > 0 else None
            state.reply_tokens = self._reply_chunks
        self.refresh_status()

    def refresh_status(self) -> None:
        state = self.status
        state.context_used = self.conversation.used_tokens
        state.context_exact = self.conversation.exact
        state.context_size = self.model.context_tokens if self.model else None
        state.session_j = self.session_energy.energy_j
        state.session_estimated = self.session_energy.estimated
        for bar in self.query(StatusBar):  # none while the app shuts down
            bar.show(state)

    def set_activity(self, activity: str, busy: bool) -> None:
        self.status.activity = activity
        self.busy = busy
        self.refresh_status()

    async def notice(self, text: str, warning: bool = False) -> None:
        await self.query_one("#chat").mount(Notice(text, warning))

    # Models --------------------------------------------------------------------------------

    def load_model(self, spec: str | None) -> None:
        self._loading = True
        self.set_activity(f"loading {spec or 'the default model'}…", True)
        self._open_model(spec)

    @work(thread=True, exclusive=True, group="model")
    def _open_model(self, spec: str | None) -> None:
        try:
            self.post_message(ModelLoaded(self.opener(spec)))
        except UserError as error:
            self.post_message(ModelFailed(str(error)))

    @on(ModelLoaded)
    async def _model_loaded(self, event: ModelLoaded) -> None:
        self._loading = False
        if self.model is not None:
            self.model.engine.close()
            self.conversation.forget_counts()
        self.model = event.model
        self.status.model = event.model.name
        if event.model.note:  # on screen before "ready", so it is read before the first question
            await self.notice(event.model.note, warning=True)
        self.set_activity("ready", False)
        if self._asked_while_loading:
            self._asked_while_loading = False
            await self.send()

    @on(ModelFailed)
    async def _model_failed(self, event: ModelFailed) -> None:
        self._loading = False
        await self.notice(f"Could not load the model: {event.error}", warning=True)
        if self._asked_while_loading:
            self._asked_while_loading = False
            self.conversation.in_context[-1].in_context = False
            await self.notice("Your message was not sent.", warning=True)
        self.set_activity("ready" if self.model else "no model: /model PATH.gguf", False)

    # Input ---------------------------------------------------------------------------------

    @on(Input.Submitted, "#prompt")
    async def _submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        event.input.value = ""
        if not text:
            return
        if text.startswith("/"):
            await self.run_command(text)
            return
        # The first question may come while the model loads: it is sent once the model is ready.
        early = self.model is None and self._loading and not self._asked_while_loading
        if not early and (self.busy or self.model is None):
            why = "the assistant is busy (Esc stops a reply)" if self.busy else "no model is loaded"
            await self.notice(f"Not sent: {why}.", warning=True)
            return
        await self.query_one("#chat").mount(UserLine(text))
        self.tool_rounds = 0
        await self.add_message("user", text)
        if early:
            self._asked_while_loading = True
            return
        await self.send()

    async def add_message(self, role: Role, content: str) -> Message:
        message = self.conversation.add(role, content)
        self.session_log.record(message, self.model.name if self.model else "")
        self.refresh_status()
        return message

    # Defined by the layers above (replies.py, app.py); declared here for type checkers only.
    if TYPE_CHECKING:

        async def send(self) -> None: ...

        async def run_command(self, text: str) -> None: ...

    def on_unmount(self) -> None:
        self._stop_reply.set()  # a streaming worker ends at its next token
