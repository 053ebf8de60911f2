"""One model reply: the engine's stream inside an energy window, relayed to the screen in
batches and stoppable with Esc; then its split into prose and tool call, and its footer line.
"""

import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

from openjarvis.errors import UserError
from openjarvis.runtime.types import ChatRequest, Completion, Engine, StreamChunk
from openjarvis.tui.energy import AssistantMeter, ReplyEnergy, format_joules
from openjarvis.tui.protocol import TOOL_CLOSE, ToolCall, parse_reply

__all__ = ["FLUSH_S", "ReplyOutcome", "ReplyStream", "reply_footer", "split_reply"]

FLUSH_S = 0.25  # streamed text reaches the screen at most this late

# Text since the last relay: the text joined, how many engine chunks (about a token each) it
# joins, and time.monotonic() when the first of them arrived.
Relay = Callable[[str, int, float], None]


@dataclass(frozen=True, slots=True)
class ReplyOutcome:
    """How a reply ended: a completion, or an error ("stopped" when the user stopped it).
    `energy` is None only when the engine refused before anything was measured."""

    completion: Completion | None
    energy: ReplyEnergy | None
    error: str | None = None


class ReplyStream:
    """Streams one request; `run` belongs in a worker thread, `stop` may come from any thread."""

    def __init__(self, meter: AssistantMeter, engine: Engine, request: ChatRequest) -> None:
        self._meter = meter
        self._engine = engine
        self._request = request
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self, relay: Relay) -> ReplyOutcome:
        try:
            with self._meter.window("jarvis reply") as window:
                stream = self._engine.stream(self._request)
                try:
                    completion = self._relay(stream, relay, window.mark_first_token)
                finally:
                    if isinstance(stream, Generator):
                        stream.close()  # frees the engine at once when the reply was stopped
        except UserError as error:
            return ReplyOutcome(None, None, str(error))
        estimate = completion.energy_estimate if completion else None
        energy = (
            ReplyEnergy.estimated(estimate) if estimate else ReplyEnergy.measured(window.result)
        )
        return ReplyOutcome(completion, energy, None if completion else "stopped")

    def _relay(
        self, stream: Iterator[StreamChunk], relay: Relay, first_token: Callable[[float], None]
    ) -> Completion | None:
        """Relay the stream's text in batches, one per FLUSH_S rather than one per token, which
        keeps the UI's share of the CPU small while the model decodes; `first_token` hears the
        first chunk's time as it comes (the window splits the prompt's energy from the reply's
        there). Returns the completion, or None when the user stopped the reply."""
        pending: list[str] = []
        first_s = posted_s = 0.0
        for index, chunk in enumerate(stream):
            if index == 0:
                first_token(chunk.time_s)
            if chunk.text:
                first_s = first_s if pending else chunk.time_s
                pending.append(chunk.text)
            stopping = self._stop.is_set()
            last = chunk.completion is not None or stopping
            if pending and (last or chunk.time_s - posted_s >= FLUSH_S):
                relay("".join(pending), len(pending), first_s)
                pending, posted_s = [], chunk.time_s
            if chunk.completion is not None:
                return chunk.completion
            if stopping:
                return None
        raise RuntimeError("the engine's stream ended without a completion")


def split_reply(completion: Completion) -> tuple[str, ToolCall | None, str]:
    """The prose to show, the tool call if any, and the text to keep in the conversation (with
    the closing tag the stop sequence cut off, so the history shows whole calls)."""
    prose, call = parse_reply(completion.text, completion.finish_reason == "stop")
    content = completion.text
    if call is not None and call.complete and TOOL_CLOSE not in content:
        content = f"{content.rstrip()}\n{TOOL_CLOSE}"
    return prose, call, content


def reply_footer(
    completion: Completion, energy: ReplyEnergy, prefill_saved_j: float | None = None
) -> str:
    """The line under a finished reply: joules, joules per token, tokens, speed, the prompt
    tokens taken from the engine's cache with the prefill joules that saved, dollars."""
    parts = [format_joules(energy.energy_j, energy.method)]
    if energy.energy_j is None and energy.null_reason:
        parts[0] = f"energy unknown ({energy.null_reason})"
    per_token = energy.per_token(completion.completion_tokens)
    if per_token is not None:
        parts.append(f"{per_token:.3f} J/token")
    parts.append(f"{completion.completion_tokens} tokens")
    if completion.decode_tokens_per_s is not None:
        parts.append(f"{completion.decode_tokens_per_s:.1f} tok/s")
    if completion.cached_tokens is not None:
        reuse = f"{completion.cached_tokens:,}/{completion.prompt_tokens:,} prompt tokens cached"
        if prefill_saved_j is not None:
            reuse += f", ≈{format_joules(prefill_saved_j, None)} prefill saved"
        parts.append(reuse)
    if completion.cost_usd is not None:
        parts.append(f"${completion.cost_usd:.4f}")
    if completion.finish_reason == "length":
        parts.append("cut off at the reply's token limit")
    return " · ".join(parts)
