"""The engine interface: a request goes in, a completion with token counts and timings comes out.

Timings follow METRICS.md ("Timing"): TTFT, prefill rate, decode rate, wall time.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Completion", "Engine", "GenerationRequest", "StreamChunk"]


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A plain-text completion request. Greedy decoding when temperature is 0."""

    prompt: str
    max_tokens: int
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """A piece of streamed text and when it arrived (time.monotonic())."""

    text: str
    time_s: float


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" or "length"
    wall_s: float
    ttft_s: float | None  # None when no token was produced
    decode_s: float | None  # first token to last token

    @property
    def prefill_tokens_per_s(self) -> float | None:
        if not self.ttft_s:
            return None
        return self.prompt_tokens / self.ttft_s

    @property
    def decode_tokens_per_s(self) -> float | None:
        """(completion_tokens - 1) / (t_last - t_first): undefined below two tokens."""
        if self.completion_tokens < 2 or not self.decode_s:
            return None
        return (self.completion_tokens - 1) / self.decode_s


class Engine(Protocol):
    """What every engine offers. Engines load their model once and serve many requests."""

    @property
    def model_name(self) -> str: ...

    def generate(self, request: GenerationRequest) -> Completion: ...

    def stream(self, request: GenerationRequest) -> Iterator[StreamChunk]: ...

    def close(self) -> None: ...
