"""The tools layer of the `jarvis` app: run the model's tool calls, asking first where it must.

Read-only tools run at once; edits show a diff and shell commands their text, and wait for
y / n / a. Results go back to the model as the next user turn, a few rounds per question.
"""

from textual import on, work

from openjarvis.runtime.types import Completion
from openjarvis.tui.edits import apply_edit
from openjarvis.tui.events import ToolFinished, ToolPending
from openjarvis.tui.protocol import TOOL_CLOSE, ToolCall, format_result, parse_reply
from openjarvis.tui.replies import ReplyApp
from openjarvis.tui.shell import run_command
from openjarvis.tui.tools import PendingCommand, PendingEdit, prepare, summary
from openjarvis.tui.widgets import ApprovalPrompt, HistoryInput, ToolView
from openjarvis.tui.workspace import ToolRefused

__all__ = ["MAX_TOOL_ROUNDS", "ToolApp"]

# Small models can loop on a tool; after this many calls in one turn the user decides.
MAX_TOOL_ROUNDS = 8


class ToolApp(ReplyApp):
    def split_reply(self, completion: Completion) -> tuple[str, ToolCall | None, str]:
        """The prose to show, the tool call if any, and the text to keep in the conversation
        (with the closing tag the stop sequence cut off, so the history shows whole calls)."""
        prose, call = parse_reply(completion.text, completion.finish_reason == "stop")
        content = completion.text
        if call is not None and call.complete and TOOL_CLOSE not in content:
            content = f"{content.rstrip()}\n{TOOL_CLOSE}"
        return prose, call, content

    async def handle_tool(self, call: ToolCall) -> None:
        self.tool_rounds += 1
        if self.tool_rounds > MAX_TOOL_ROUNDS:
            await self.notice(
                f"Stopped: {MAX_TOOL_ROUNDS} tool calls in one turn. Ask again to continue.",
                warning=True,
            )
            self.set_activity("ready", False)
            return
        self.set_activity(f"{summary(call)}…", True)
        self.prepare_tool(call)

    @work(thread=True, group="tool")
    def prepare_tool(self, call: ToolCall) -> None:
        """Read, list or search (slow in a large tree), or plan the edit or command."""
        try:
            outcome = prepare(self.workspace, call)
        except ToolRefused as refusal:
            self.post_message(
                ToolFinished(call, f"{summary(call)} · refused", f"refused: {refusal}")
            )
            return
        if isinstance(outcome, str):
            lines = outcome.count("\n") + 1
            self.post_message(ToolFinished(call, f"{summary(call)} · {lines} lines", outcome))
        else:
            self.post_message(ToolPending(outcome))

    @on(ToolPending)
    async def _tool_pending(self, event: ToolPending) -> None:
        if event.pending.kind in self.always:
            await self._approved(event.pending)
            return
        prompt = ApprovalPrompt(event.pending)
        await self.query_one("#chat").mount(prompt)
        prompt.focus()
        self.set_activity("waiting for your approval (y / n / a)", True)

    @on(ApprovalPrompt.Decided)
    async def _decided(self, event: ApprovalPrompt.Decided) -> None:
        pending = event.control.pending
        await event.control.remove()
        self.query_one(HistoryInput).focus()
        if event.decision == "no":
            what = "edit" if isinstance(pending, PendingEdit) else "command"
            await self._show_tool(f"{summary(pending.call)} · declined", "")
            await self.add_message(
                "tool",
                format_result(
                    pending.call, f"the user declined this {what}; ask them what to do instead"
                ),
            )
            self.set_activity("ready", False)
            return
        if event.decision == "always":
            self.always.add(pending.kind)
        await self._approved(pending)

    async def _approved(self, pending: PendingEdit | PendingCommand) -> None:
        if isinstance(pending, PendingCommand):
            self.set_activity(f"running {pending.command}…", True)
            self.run_shell(pending)
            return
        title = f"{summary(pending.call)} · applied"
        try:
            self.undo_stack.push(apply_edit(self.workspace, pending.plan))
            result = f"applied to {pending.plan.relative}"
        except ToolRefused as refusal:
            title, result = f"{summary(pending.call)} · not applied", f"refused: {refusal}"
        await self._tool_done(pending.call, title, pending.plan.diff, result)

    @work(thread=True, group="tool")
    def run_shell(self, pending: PendingCommand) -> None:
        result = run_command(pending.command, self.workspace.root, self.shell_timeout_s)
        status = "timed out" if result.exit_code is None else f"exit {result.exit_code}"
        self.post_message(
            ToolFinished(pending.call, f"$ {pending.command} · {status}", result.for_model())
        )

    @on(ToolFinished)
    async def _tool_finished(self, event: ToolFinished) -> None:
        await self._tool_done(event.call, event.title, event.result, event.result)

    async def _show_tool(self, title: str, shown: str) -> None:
        await self.query_one("#chat").mount(ToolView(title, shown))

    async def _tool_done(self, call: ToolCall, title: str, shown: str, result: str) -> None:
        """Show the outcome, hand it to the model, and let the model go on."""
        await self._show_tool(title, shown)
        await self.add_message("tool", format_result(call, result))
        await self.send()
