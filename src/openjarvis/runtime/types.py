"""The engine interface: a request goes in, a completion with token counts and timings comes out.

Timings: TTFT, prefill rate, decode rate, wall time, and MBU (decode rate x bytes read per
token over the measured memory bandwidth).
"""

from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from openjarvis.runtime.ledger import StepLedger, WorkPiece

__all__ = [
    "ChatMessage",
    "ChatRequest",
    "Completion",
    "EnergyEstimate",
    "Engine",
    "GenerationRequest",
    "Request",
    "StepLedger",
    "StreamChunk",
    "WorkPiece",
    "final_completion",
    "held_back",
]

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A plain-text completion request. Greedy decoding when temperature is 0.

    `json_schema` constrains the output to JSON that the schema accepts. `max_tokens` None
    lets the completion run to the end of the model's context.
    """

    prompt: str
    max_tokens: int | None
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    seed: int | None = None
    json_schema: dict[str, object] | None = None
    # The energy window this request runs in, as the meter keys it: a batching engine files
    # the request's steps under it in its step ledger (runtime/ledger.py).
    ledger_key: int | None = None


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Role
    content: str


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A chat request: the engine renders the messages with the model's own chat template."""

    messages: tuple[ChatMessage, ...]
    max_tokens: int | None
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    seed: int | None = None
    json_schema: dict[str, object] | None = None
    # The energy window this request runs in, as the meter keys it: a batching engine files
    # the request's steps under it in its step ledger (runtime/ledger.py).
    ledger_key: int | None = None


Request = GenerationRequest | ChatRequest


@dataclass(frozen=True, slots=True)
class EnergyEstimate:
    """Energy that no local meter can read (a cloud model's), modelled from token counts.

    Always method `estimate`: a cloud API reports no energy; `basis` names the constants.
    """

    source: str  # e.g. "estimate:cloud:frontier"
    energy_j: float
    basis: str
    # The prompt tokens' part by the same constants (J per input token); None: not modelled.
    prefill_energy_j: float | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" or "length"
    wall_s: float
    ttft_s: float | None  # None when no token was produced
    decode_s: float | None  # first token to last token
    # Bytes read from memory per decoded token (weights + KV cache); None when not known.
    decode_bytes_per_token: float | None = None
    # Share of the measured memory bandwidth the decode used (MBU); None when unknown.
    memory_bandwidth_utilisation: float | None = None
    cost_usd: float | None = None  # what a paid API charged; None for local engines
    energy_estimate: EnergyEstimate | None = None  # set only where no meter can read the energy
    # The steps of a batching engine this request took part in (its mean batch, for the record
    # and for bytes per token); empty from engines that run one request at a time. The meter
    # splits shared energy by the engine's step ledger as steps land, not by this list.
    work: tuple[WorkPiece, ...] = ()
    # Prompt tokens whose keys and values came from the engine's cache instead of being
    # computed (a prefix shared with an earlier request); None: the engine does not say.
    cached_tokens: int | None = None

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


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """A piece of streamed text and when it arrived (time.monotonic()).

    The last chunk of every stream carries the finished `completion` (its text may be empty).
    """

    text: str
    time_s: float
    completion: Completion | None = None


def final_completion(chunks: Iterable[StreamChunk]) -> Completion:
    """Drain a stream and return the completion its last chunk carries."""
    last: StreamChunk | None = None
    for last in chunks:  # noqa: B007 - only the last chunk is wanted
        pass
    if last is None or last.completion is None:
        raise RuntimeError("the engine's stream ended without a completion")
    return last.completion


class Engine(Protocol):
    """What every engine offers. Engines load their model once and serve many requests.

    `generate` is `final_completion(stream(request))`: one code path for both.
    """

    @property
    def kind(self) -> str: ...  # "llamacpp", "torch", "openai", "anthropic"

    @property
    def model_name(self) -> str: ...

    # The GPUs it computes on, as CUDA device indices in its own process (positions in
    # CUDA_VISIBLE_DEVICES); empty when it uses none. The meter reads these GPUs and no others.
    @property
    def devices(self) -> tuple[int, ...]: ...

    # How many streams may be in flight at once: 1 for an engine that takes requests in turn
    # (a second stream waits for the first), more for one that batches or calls a remote API.
    @property
    def concurrency(self) -> int: ...

    # A batching engine's step ledger, by which the meter splits the energy of requests that
    # share its steps; None for an engine that runs one request at a time or remotely.
    @property
    def ledger(self) -> StepLedger | None: ...

    def settings_dict(self) -> dict[str, object]: ...

    def generate(self, request: Request) -> Completion: ...

    # A generator: closing it early (a client that leaves) frees the engine.
    def stream(self, request: Request) -> Generator[StreamChunk]: ...

    def close(self) -> None: ...


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters could still be the start of a stop sequence: a streaming
    engine holds them back until the next token says whether they are text or the stop."""
    if not text:
        return 0
    held, last = 0, text[-1]
    for stop in stops:
        # A held prefix ends with the text's last character: only those sizes are tried (found
        # by rfind, longest first; a token's text most often ends with none of them).
        end = min(len(stop) - 1, len(text))
        while (at := stop.rfind(last, 0, end)) >= held:
            if text.endswith(stop[: at + 1]):
                held = at + 1
                break
            end = at
    return held
