"""The replies layer of the `jarvis` app: check the context, stream the model's reply into the
chat with its energy window, and finish it with its joules, tokens and speed.
"""

from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING

from textual import on, work

from openjarvis.errors import UserError
from openjarvis.runtime.types import ChatRequest, Completion, StreamChunk
from openjarvis.tui.chat import ChatApp
from openjarvis.tui.energy import ReplyEnergy, format_joules
from openjarvis.tui.engines import LoadedModel
from openjarvis.tui.events import ReplyChunk, ReplyDone, ReplyFailed
from openjarvis.tui.protocol import ToolCall
from openjarvis.tui.widgets import ContextPrompt, HistoryInput, ReplyView

__all__ = ["FLUSH_S", "ReplyApp"]

FLUSH_S = 0.25  # streamed text reaches the screen at most this late


class ReplyApp(ChatApp):
    def reply_tokens(self) -> int:
        size = self.model.context_tokens if self.model else None
        return self._reply_budget if size is None else min(self._reply_budget, size // 4)

    async def send(self) -> None:
        """Send the conversation, unless it would not fit: then ask before dropping turns."""
        assert self.model is not None
        check = self.conversation.check(self.model.context_tokens, self.reply_tokens())
        if not check.fits:
            self.set_activity("context full: drop old turns?", True)
            prompt = ContextPrompt(check)
            await self.query_one("#chat").mount(prompt)
            prompt.focus()
            return
        self._reply = ReplyView(self.model.name)
        await self.query_one("#chat").mount(self._reply)
        self._reply_chunks, self._reply_first_s = 0, None
        self.status.reply_j, self.status.reply_method, self.status.reply_live = None, None, True
        self.status.tokens_per_s, self.status.reply_tokens = None, 0
        self._stop_reply.clear()
        self.set_activity("replying… (Esc stops)", True)
        self.stream_reply(self.model, self.conversation.request(self.reply_tokens()))

    @on(ContextPrompt.Decided)
    async def _context_decided(self, event: ContextPrompt.Decided) -> None:
        event.control.remove()
        self.query_one(HistoryInput).focus()
        assert self.model is not None and self.model.context_tokens is not None
        if event.drop:
            dropped = self.conversation.drop_oldest_turns(
                self.model.context_tokens, self.reply_tokens()
            )
            self.session_log.dropped(dropped)
            freed = sum(m.context_tokens for m in dropped)
            await self.notice(
                f"Dropped {len(dropped)} old messages (~{freed:,} tokens) from the context; "
                "they stay in the session's history."
            )
            if self.conversation.check(self.model.context_tokens, self.reply_tokens()).fits:
                await self.send()
                return
            await self.notice("Still too long: the newest message alone does not fit.", True)
        newest = self.conversation.in_context[-1]
        newest.in_context = False  # not sent, so not part of what the model will see
        self.session_log.dropped([newest])
        await self.notice("Not sent; the message stays in the history, outside the context.")
        self.set_activity("ready", False)

    @work(thread=True, group="reply")
    def stream_reply(self, model: LoadedModel, request: ChatRequest) -> None:
        try:
            with self.meter.window("jarvis reply") as window:
                stream = model.engine.stream(request)
                try:
                    completion = self._relay(stream)
                finally:
                    if isinstance(stream, Generator):
                        stream.close()  # frees the engine at once when the reply was stopped
        except UserError as error:
            self.post_message(ReplyFailed(str(error), None))
            return
        estimate = completion.energy_estimate if completion else None
        energy = (
            ReplyEnergy.estimated(estimate) if estimate else ReplyEnergy.measured(window.result)
        )
        if completion is None:
            self.post_message(ReplyFailed("stopped", energy))
        else:
            self.post_message(ReplyDone(completion, energy))

    def _relay(self, stream: Iterator[StreamChunk]) -> Completion | None:
        """Post the stream's text to the UI in batches, one per FLUSH_S rather than one per
        token, which keeps the UI's share of the CPU small while the model decodes. Returns
        the completion, or None when the user stopped the reply."""
        pending: list[str] = []
        first_s = posted_s = 0.0
        for chunk in stream:
            if chunk.text:
                first_s = first_s if pending else chunk.time_s
                pending.append(chunk.text)
            stopping = self._stop_reply.is_set()
            last = chunk.completion is not None or stopping
            if pending and (last or chunk.time_s - posted_s >= FLUSH_S):
                self.post_message(ReplyChunk("".join(pending), len(pending), first_s))
                pending, posted_s = [], chunk.time_s
            if chunk.completion is not None:
                return chunk.completion
            if stopping:
                return None
        raise RuntimeError("the engine's stream ended without a completion")

    def action_stop_reply(self) -> None:
        self._stop_reply.set()

    @on(ReplyChunk)
    async def _reply_chunk(self, event: ReplyChunk) -> None:
        if self._reply is None:
            return
        self._reply_chunks += event.pieces
        if self._reply_first_s is None:
            self._reply_first_s = event.time_s
        self._reply.write(event.text)

    @on(ReplyFailed)
    async def _reply_failed(self, event: ReplyFailed) -> None:
        assert self.model is not None
        if event.energy is not None:
            self.session_energy.add(self.model.name, event.energy, 0, None)
            self.status.reply_j, self.status.reply_method = (
                event.energy.energy_j,
                event.energy.method,
            )
        self.status.reply_live = False
        if self._reply is not None:
            await self._reply.finish(self._reply.text, f"{event.error} · not kept in the context")
        if event.error != "stopped":
            await self.notice(f"The model could not reply: {event.error}", warning=True)
        self.set_activity("ready", False)

    @on(ReplyDone)
    async def _reply_done(self, event: ReplyDone) -> None:
        assert self.model is not None and self._reply is not None
        completion, energy = event.completion, event.energy
        self.session_energy.add(
            self.model.name, energy, completion.completion_tokens, completion.cost_usd
        )
        state = self.status
        state.reply_live = False
        state.reply_j, state.reply_method = energy.energy_j, energy.method
        state.reply_tokens = completion.completion_tokens
        state.tokens_per_s = completion.decode_tokens_per_s
        prose, call, content = self.split_reply(completion)
        message = self.conversation.add_reply(
            content, completion.prompt_tokens, completion.completion_tokens
        )
        self.session_log.record(
            message, self.model.name, energy, completion.prompt_tokens, completion.cost_usd
        )
        await self._reply.finish(prose, self._footer(completion, energy))
        self.refresh_status()
        if call is None:
            self.set_activity("ready", False)
        else:
            await self.handle_tool(call)

    def _footer(self, completion: Completion, energy: ReplyEnergy) -> str:
        parts = [format_joules(energy.energy_j, energy.method)]
        if energy.energy_j is None and energy.null_reason:
            parts[0] = f"energy unknown ({energy.null_reason})"
        per_token = energy.per_token(completion.completion_tokens)
        if per_token is not None:
            parts.append(f"{per_token:.3f} J/token")
        parts.append(f"{completion.completion_tokens} tokens")
        if completion.decode_tokens_per_s is not None:
            parts.append(f"{completion.decode_tokens_per_s:.1f} tok/s")
        if completion.cost_usd is not None:
            parts.append(f"${completion.cost_usd:.4f}")
        if completion.finish_reason == "length":
            parts.append("cut off at the reply's token limit")
        return " · ".join(parts)

    # Defined by the layer above (tooling.py); declared here for type checkers only.
    if TYPE_CHECKING:

        def split_reply(self, completion: Completion) -> tuple[str, ToolCall | None, str]: ...

        async def handle_tool(self, call: ToolCall) -> None: ...
