"""The `jarvis` app: the chat and tools layers plus the slash commands a user types.

`/help` lists them; each command is one small method named after it.
"""

from openjarvis.tui.tooling import ToolApp

__all__ = ["HELP", "AssistantApp"]

HELP = """\
**jarvis**: ask about the code in this folder; the model can read, search, edit files and run
commands, and every edit and command waits for your **y** (yes), **n** (no) or **a** (always,
for the rest of the session).

- `/model`: show the model; `/model SPEC` switches: `default`, `PATH.gguf`, a cached `NAME`
  (see `jarvis models`), `openai:MODEL[@BASE_URL]` (any OpenAI-compatible server),
  `anthropic:MODEL`
- `/cost`: the session's energy (and dollars for cloud models) by model
- `/undo`: revert the last edit the assistant applied
- `/clear`: start a new session (the old one stays stored; `jarvis --resume` continues the last)
- `/help`: this list; `/quit` leaves (also Ctrl+Q)

Esc stops a reply. The status bar shows the context used against the model's size (`~`: an
estimate until the next reply counts it), watts now, the reply's joules, joules per token and
tokens per second, and the session's joules; `≈` marks modelled energy (an estimate)."""


class AssistantApp(ToolApp):
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
        await self.notice(self.session_energy.report())

    async def command_quit(self, argument: str) -> None:
        self.exit()

    async def _refuse_while_busy(self, command: str) -> bool:
        if self.busy:
            await self.notice(f"`/{command}` waits until the assistant is idle.", warning=True)
        return self.busy

    async def command_undo(self, argument: str) -> None:
        if await self._refuse_while_busy("undo"):
            return
        outcome = self.undo_stack.undo()
        await self.notice(outcome)
        if outcome.startswith("undone"):
            # The model must not go on believing the file holds its edit.
            await self.add_message("tool", f"[the user ran /undo: {outcome}]")

    async def command_clear(self, argument: str) -> None:
        if await self._refuse_while_busy("clear"):
            return
        self.conversation.clear()
        self.session_energy.clear()
        self.session_log.new_session()
        self.status.reply_j = None
        self.status.reply_tokens = 0
        self.status.tokens_per_s = None
        chat = self.query_one("#chat")
        await chat.remove_children()
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
