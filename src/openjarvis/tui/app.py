"""The `jarvis` app: one Textual App that lays out the chat, handles the user's input and the
workers' messages, and leaves the work to plain objects: the chat (conversation, log, energy
totals), reply streams, the tool runner and the live status.

Slow work (loading a model, a reply, a tool) runs in thread workers that post messages
(events.py) back; only the handlers here touch widgets.
"""

from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Input

from openjarvis.errors import UserError
from openjarvis.store import Store
from openjarvis.tui.chat import REPLY_TOKENS, Chat
from openjarvis.tui.conversation import Role
from openjarvis.tui.energy import AssistantMeter, LiveWatts, format_joules
from openjarvis.tui.engines import LoadedModel, ModelOpener
from openjarvis.tui.events import (
    ModelFailed,
    ModelLoaded,
    ReplyChunk,
    ReplyEnded,
    TestsFinished,
    ToolFinished,
    ToolPending,
)
from openjarvis.tui.project_tests import TEST_TIMEOUT_S, detect_test_command, run_tests
from openjarvis.tui.protocol import ToolCall, parse_reply
from openjarvis.tui.replies import ReplyStream, reply_footer, split_reply
from openjarvis.tui.status import LiveStatus, StatusBar, StatusState
from openjarvis.tui.tooling import MAX_TOOL_ROUNDS, ToolOutcome, ToolRunner
from openjarvis.tui.tools import PendingCommand, PendingEdit, summary
from openjarvis.tui.widgets import (
    ApprovalPrompt,
    ContextPrompt,
    FailuresPrompt,
    HistoryInput,
    Notice,
    ReplyView,
    ToolView,
    UserLine,
)
from openjarvis.tui.workspace import Workspace

__all__ = ["HELP", "AssistantApp"]

STATUS_PERIOD_S = 0.5  # twice a second: live, and light on a small machine

HELP = """\
**jarvis**: ask about the code in this folder; the model can read, search, edit files and run
commands, and every edit and command waits for your **y** (yes), **n** (no) or **a** (always,
for the rest of the session).

- `/model`: show the model; `/model SPEC` switches: `default`, `PATH.gguf`, a cached `NAME`
  (see `jarvis models`), `openai:MODEL[@BASE_URL]` (any OpenAI-compatible server),
  `anthropic:MODEL`
- `/cost`: the session's energy (and dollars for cloud models) by model
- `/test`: run the project's tests (pytest, npm test, cargo test or go test, found from its
  files; `/test COMMAND` sets another for the session), with the joules they took; failures
  can go to the model
- `/map`: the repository map the model sees (each file's definitions, the most used first)
- `/undo`: revert the last edit the assistant applied
- `/clear`: start a new session (the old one stays stored; `jarvis --resume` continues the last)
- `/help`: this list; `/quit` leaves (also Ctrl+Q)

Esc stops a reply. The status bar shows the context used against the model's size (`~`: an
estimate until the next reply counts it), watts now, the reply's joules, joules per token and
tokens per second, and the session's joules; `≈` marks modelled energy (an estimate)."""


class AssistantApp(App[None]):
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
        meter: AssistantMeter,
        store: Store,
        working_dir: Path,
        resume_session: str | None = None,
        shell_timeout_s: float = 120.0,
        reply_tokens: int = REPLY_TOKENS,
    ) -> None:
        super().__init__()
        self.opener = opener
        self.meter = meter
        workspace = Workspace(working_dir)
        self.chat = Chat(store, workspace.root, resume_session, reply_tokens)
        self.tools = ToolRunner(workspace, shell_timeout_s)
        self.live = LiveStatus(LiveWatts(meter))
        self.model: LoadedModel | None = None
        self.busy = False
        self._initial_spec = model_spec
        self._loading = False
        self._asked_while_loading = False  # a question typed before the model was ready
        self._reply: ReplyView | None = None  # the reply streaming into the chat
        self._reply_stream: ReplyStream | None = None
        self._test_command: str | None = None  # set by `/test COMMAND` for the session

    @property
    def status(self) -> StatusState:
        return self.live.state

    def compose(self) -> ComposeResult:
        yield VerticalScroll(id="chat")
        yield StatusBar(id="status", markup=False)
        yield HistoryInput(placeholder="Ask, or /help", id="prompt")

    async def on_mount(self) -> None:
        self.query_one("#chat").anchor()
        if self.chat.log.session_id is not None:
            await self._show_resumed()
        self.set_interval(STATUS_PERIOD_S, self._tick)
        self.query_one(HistoryInput).focus()
        self.load_model(self._initial_spec)

    def on_unmount(self) -> None:
        if self._reply_stream is not None:
            self._reply_stream.stop()  # a streaming worker ends at its next token

    async def _show_resumed(self) -> None:
        messages = self.chat.resume()
        prompt = self.query_one(HistoryInput)
        for message in messages:
            if message.role == "user":
                prompt.remember(message.content)
                await self._mount(UserLine(message.content))
            elif message.role == "assistant":
                prose, call = parse_reply(message.content, stopped_at_close=True)
                view = ReplyView("earlier reply")
                await self._mount(view)
                await view.finish(prose, "" if call is None else f"called {summary(call)}")
        await self.notice(f"Resumed the last session ({len(messages)} messages).")

    # The chat and the status bar ------------------------------------------------------------

    async def _mount(self, *widgets: Widget) -> None:
        await self.query_one("#chat", VerticalScroll).mount(*widgets)

    async def notice(self, text: str, warning: bool = False) -> None:
        await self._mount(Notice(text, warning))

    def _tick(self) -> None:
        self.live.tick()
        self.refresh_status()

    def refresh_status(self) -> None:
        context_size = self.model.context_tokens if self.model else None
        self.live.account(self.chat.conversation, context_size, self.chat.energy)
        for bar in self.query(StatusBar):  # none while the app shuts down
            bar.show(self.status)

    def set_activity(self, activity: str, busy: bool) -> None:
        self.status.activity = activity
        self.busy = busy
        self.refresh_status()

    # Models ---------------------------------------------------------------------------------

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
            self.chat.conversation.forget_counts()
            self.chat.prefill_price.forget()
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
            self.chat.withdraw_newest()
            await self.notice("Your message was not sent.", warning=True)
        self.set_activity("ready" if self.model else "no model: /model PATH.gguf", False)

    # Input ----------------------------------------------------------------------------------

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
        await self._mount(UserLine(text))
        self.tools.new_turn()
        self.add_message("user", text)
        if early:
            self._asked_while_loading = True
            return
        await self.send()

    def add_message(self, role: Role, content: str) -> None:
        self.chat.add(role, content, self.model.name if self.model else "")
        self.refresh_status()

    # Replies --------------------------------------------------------------------------------

    async def send(self) -> None:
        """Send the conversation, unless it would not fit: then ask before dropping turns."""
        assert self.model is not None
        check = self.chat.check(self.model.context_tokens)
        if not check.fits:
            self.set_activity("context full: drop old turns?", True)
            prompt = ContextPrompt(check)
            await self._mount(prompt)
            prompt.focus()
            return
        self._reply = ReplyView(self.model.name)
        await self._mount(self._reply)
        self.live.reply_started()
        self._reply_stream = ReplyStream(
            self.meter, self.model.engine, self.chat.request(self.model.context_tokens)
        )
        self.set_activity("replying… (Esc stops)", True)
        self._stream_reply(self._reply_stream)

    @on(ContextPrompt.Decided)
    async def _context_decided(self, event: ContextPrompt.Decided) -> None:
        event.control.remove()
        self.query_one(HistoryInput).focus()
        assert self.model is not None and self.model.context_tokens is not None
        if event.drop:
            dropped, fits = self.chat.drop_to_fit(self.model.context_tokens)
            freed = sum(m.context_tokens for m in dropped)
            await self.notice(
                f"Dropped {len(dropped)} old messages (~{freed:,} tokens) from the context; "
                "they stay in the session's history."
            )
            if fits:
                await self.send()
                return
            await self.notice("Still too long: the newest message alone does not fit.", True)
        self.chat.withdraw_newest()  # not sent, so not part of what the model will see
        await self.notice("Not sent; the message stays in the history, outside the context.")
        self.set_activity("ready", False)

    @work(thread=True, group="reply")
    def _stream_reply(self, stream: ReplyStream) -> None:
        def relay(text: str, pieces: int, time_s: float) -> None:
            self.post_message(ReplyChunk(text, pieces, time_s))

        self.post_message(ReplyEnded(stream.run(relay)))

    def action_stop_reply(self) -> None:
        if self._reply_stream is not None:
            self._reply_stream.stop()

    @on(ReplyChunk)
    def _reply_chunk(self, event: ReplyChunk) -> None:
        if self._reply is None:
            return
        self.live.reply_streamed(event.pieces, event.time_s)
        self._reply.write(event.text)

    @on(ReplyEnded)
    async def _reply_ended(self, event: ReplyEnded) -> None:
        assert self.model is not None and self._reply is not None
        completion, energy = event.outcome.completion, event.outcome.energy
        self._reply_stream = None
        self.live.reply_ended(energy, completion)
        if completion is None:
            error = event.outcome.error
            if energy is not None:
                self.chat.add_unkept_reply(self.model.name, energy, self.model.is_cloud)
            await self._reply.finish(self._reply.text, f"{error} · not kept in the context")
            if error != "stopped":
                await self.notice(f"The model could not reply: {error}", warning=True)
            self.set_activity("ready", False)
            return
        assert energy is not None, "a completed reply always has its energy"
        prose, call, content = split_reply(completion)
        saved_j = self.chat.add_reply(
            self.model.name, completion, content, energy, self.model.is_cloud
        )
        await self._reply.finish(prose, reply_footer(completion, energy, saved_j))
        self.refresh_status()
        if call is None:
            self.set_activity("ready", False)
        else:
            await self._run_tool(call)

    # Tools ----------------------------------------------------------------------------------

    async def _run_tool(self, call: ToolCall) -> None:
        if not self.tools.next_round():
            await self.notice(
                f"Stopped: {MAX_TOOL_ROUNDS} tool calls in one turn. Ask again to continue.",
                warning=True,
            )
            self.set_activity("ready", False)
            return
        self.set_activity(f"{summary(call)}…", True)
        self._prepare_tool(call)

    @work(thread=True, group="tool")
    def _prepare_tool(self, call: ToolCall) -> None:
        prepared = self.tools.prepare(call)
        if isinstance(prepared, ToolOutcome):
            self.post_message(ToolFinished(prepared))
        else:
            self.post_message(ToolPending(prepared))

    @on(ToolPending)
    async def _tool_pending(self, event: ToolPending) -> None:
        if self.tools.approved_already(event.pending):
            await self._approved(event.pending)
            return
        prompt = ApprovalPrompt(event.pending)
        await self._mount(prompt)
        prompt.focus()
        self.set_activity("waiting for your approval (y / n / a)", True)

    @on(ApprovalPrompt.Decided)
    async def _approval_decided(self, event: ApprovalPrompt.Decided) -> None:
        pending = event.control.pending
        await event.control.remove()
        self.query_one(HistoryInput).focus()
        if event.decision == "no":
            outcome = self.tools.decline(pending)
            await self._mount(ToolView(outcome.title, outcome.shown))
            self.add_message("tool", outcome.for_model)
            self.set_activity("ready", False)
            return
        if event.decision == "always":
            self.tools.approve_always(pending)
        await self._approved(pending)

    async def _approved(self, pending: PendingEdit | PendingCommand) -> None:
        if isinstance(pending, PendingCommand):
            self.set_activity(f"running {pending.command}…", True)
            self._run_command(pending)
            return
        await self._tool_done(self.tools.apply(pending))

    @work(thread=True, group="tool")
    def _run_command(self, pending: PendingCommand) -> None:
        self.post_message(ToolFinished(self.tools.run_command(pending)))

    @on(ToolFinished)
    async def _tool_finished(self, event: ToolFinished) -> None:
        await self._tool_done(event.outcome)

    async def _tool_done(self, outcome: ToolOutcome) -> None:
        """Show the outcome, hand it to the model, and let the model go on."""
        await self._mount(ToolView(outcome.title, outcome.shown))
        self.add_message("tool", outcome.for_model)
        await self.send()

    # Slash commands: `/NAME ARGUMENT` runs command_NAME(ARGUMENT) ---------------------------

    async def run_command(self, text: str) -> None:
        name, _, argument = text[1:].partition(" ")
        command = getattr(self, f"command_{name}", None)
        if command is None:
            await self.notice(f"Unknown command `/{name}`; `/help` lists them.", warning=True)
            return
        await command(argument.strip())

    async def command_help(self, argument: str) -> None:
        await self.notice(HELP)

    async def command_cost(self, argument: str) -> None:
        await self.notice(self.chat.energy.report())

    async def command_map(self, argument: str) -> None:
        shown = self.chat.repository_map
        if not shown:
            await self.notice("No repository map: no file here has definitions it can read.")
            return
        await self.notice(f"```\n{shown}\n```")

    async def command_quit(self, argument: str) -> None:
        self.exit()

    async def _refuse_while_busy(self, command: str) -> bool:
        if self.busy:
            await self.notice(f"`/{command}` waits until the assistant is idle.", warning=True)
        return self.busy

    async def command_test(self, argument: str) -> None:
        if await self._refuse_while_busy("test"):
            return
        if argument:
            self._test_command = argument
        command, found_by = self._test_command, "set with /test COMMAND"
        if command is None:
            command, found_by = detect_test_command(self.tools.workspace.root)
        if command is None:
            await self.notice(f"No test command found ({found_by}); `/test COMMAND` sets one.")
            return
        await self.notice(f"Running `{command}` ({found_by})…")
        self.set_activity(f"testing: {command}…", True)
        self._run_tests(command)

    @work(thread=True, group="tool")
    def _run_tests(self, command: str) -> None:
        root = self.tools.workspace.root
        self.post_message(TestsFinished(run_tests(command, root, self.meter, TEST_TIMEOUT_S)))

    @on(TestsFinished)
    async def _tests_finished(self, event: TestsFinished) -> None:
        run = event.run
        joules = format_joules(run.energy.energy_j, run.energy.method)
        if run.energy.energy_j is None and run.energy.null_reason:
            joules = f"energy unknown ({run.energy.null_reason})"
        title = f"$ {run.result.command} · {run.status} · {joules}"
        await self._mount(ToolView(title, run.result.for_model()))
        self.set_activity("ready", False)
        if run.passed:
            await self.notice(f"Tests passed · {joules}")
            return
        await self.notice(f"Tests {run.status} · {joules}", warning=True)
        prompt = FailuresPrompt(run, self.model is not None)
        await self._mount(prompt)
        prompt.focus()

    @on(FailuresPrompt.Decided)
    async def _failures_decided(self, event: FailuresPrompt.Decided) -> None:
        run = event.control.run
        await event.control.remove()
        self.query_one(HistoryInput).focus()
        if not event.send or self.model is None or self.busy:
            return
        await self._mount(UserLine("[the test failures]"))
        self.tools.new_turn()
        self.add_message("user", run.for_model())
        await self.send()

    async def command_undo(self, argument: str) -> None:
        if await self._refuse_while_busy("undo"):
            return
        outcome = self.tools.undo_stack.undo()
        await self.notice(outcome)
        if outcome.startswith("undone"):
            # The model must not go on believing the file holds its edit.
            self.add_message("tool", f"[the user ran /undo: {outcome}]")

    async def command_clear(self, argument: str) -> None:
        if await self._refuse_while_busy("clear"):
            return
        self.chat.clear()
        self.live.reply_cleared()
        await self.query_one("#chat", VerticalScroll).remove_children()
        await self.notice("New session: the conversation and the session's joules start again.")
        self.refresh_status()

    async def command_model(self, argument: str) -> None:
        if not argument:
            if self.model is None:
                await self.notice("No model is loaded; `/model PATH.gguf` loads one.")
                return
            size = self.model.context_tokens
            await self.notice(
                f"Model **{self.model.name}** ({self.model.engine.kind}), context "
                f"{'unknown' if size is None else f'{size:,} tokens'}. `/model SPEC` switches; "
                "`/help` lists the specs."
            )
            return
        if await self._refuse_while_busy("model"):
            return
        self.load_model(argument)
