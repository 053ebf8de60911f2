"""The OpenAI wire format of `jarvis serve`: request bodies as pydantic models, turned into engine
requests, and completions plus energy back to response bodies and stream chunks (with the extra
`energy` field).

Unknown fields are ignored, as OpenAI-compatible servers do; a field the server cannot honour
(`tools`, `n` > 1, ...) is refused with its name rather than silently dropped.
"""

import time
import uuid
from dataclasses import dataclass
from pathlib import PurePath
from typing import Annotated, Literal, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field, field_validator

from openjarvis.power.types import Method, Scope, WindowEnergy
from openjarvis.runtime.types import (
    ChatMessage,
    ChatRequest,
    Completion,
    EnergyEstimate,
    GenerationRequest,
    Request,
    Role,
)

__all__ = [
    "BadRequest",
    "ChatBody",
    "CompletionBody",
    "EnergyField",
    "ParsedRequest",
    "chunk_body",
    "completion_body",
    "energy_field",
    "parse_request",
    "serves_model",
]

_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}
_UNSUPPORTED = ("tools", "functions", "logprobs", "top_logprobs", "echo", "suffix")

# Strict: a JSON string or boolean is not a number here (pydantic's lax mode would take "0.5").
_PositiveInt = Annotated[int, Field(strict=True, ge=1)]
_Number = Annotated[float, Field(strict=True)]
_Flag = Annotated[bool, Field(strict=True)]  # lax would take "yes" and "off"


class BadRequest(Exception):
    """A request the server cannot serve: answered 400 with this message and the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class _ContentPart(BaseModel):
    type: str
    text: str = ""


class _Message(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    # A string, or text parts; None for an assistant turn that only called tools.
    content: str | list[_ContentPart] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _string_or_parts(cls, value: object) -> object:
        # One plain message instead of pydantic's error per member of the union.
        if value is None or isinstance(value, str | list):
            return value
        raise ValueError("must be a string or a list of text parts")


class _JsonSchema(BaseModel):
    model_config = ConfigDict(extra="ignore")
    schema_: dict[str, object] = Field(alias="schema")


class _ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: _JsonSchema | None = None


class _StreamOptions(BaseModel):
    include_usage: _Flag = False


class _Body(BaseModel):
    """What chat and plain completion bodies share."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: _PositiveInt | None = None
    max_completion_tokens: _PositiveInt | None = None
    stop: str | list[str] | None = None
    # OpenAI's range; null is the API's default, 1.
    temperature: Annotated[_Number, Field(ge=0, le=2)] | None = None
    seed: Annotated[int, Field(strict=True)] | None = None
    stream: _Flag = False
    stream_options: _StreamOptions | None = None
    response_format: _ResponseFormat | None = None
    n: Annotated[int, Field(strict=True)] | None = None
    best_of: Annotated[int, Field(strict=True)] | None = None
    # Refused when set (each names itself in the 400), accepted when empty or false.
    tools: object = None
    functions: object = None
    logprobs: object = None
    top_logprobs: object = None
    echo: object = None
    suffix: object = None

    @field_validator("stop", mode="before")
    @classmethod
    def _string_or_strings(cls, value: object) -> object:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return value
        raise ValueError("must be a string or a list of strings")


class ChatBody(_Body):
    """A /v1/chat/completions body."""

    messages: Annotated[list[_Message], Field(min_length=1)]


class CompletionBody(_Body):
    """A /v1/completions body: one prompt (a list of one string is taken as that string)."""

    prompt: str | list[str]

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: object) -> object:
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if isinstance(value, str):
            return value
        raise ValueError("must be a string (one prompt per request)")


class _RequestOptions(TypedDict):
    """What chat and completion requests share (the engine request's keyword arguments)."""

    max_tokens: int | None
    stop: tuple[str, ...]
    temperature: float
    seed: int | None
    json_schema: dict[str, object] | None


class EnergyField(TypedDict):
    """The `energy` extra field of a reply, as sent and as the request log stores it."""

    energy_j: float | None
    net_energy_j: float | None
    method: Method | None
    scope: Scope
    null_reason: str | None
    duration_s: float
    # Split with other requests that ran at the same time (by the work each did), and the
    # mean number of sequences in the engine's steps; False and None for a request alone.
    shared: bool
    mean_batch: float | None
    basis: NotRequired[str]  # a cloud estimate's constants
    low_resolution: NotRequired[bool]  # the meter's windows only
    # The meter's windows only: energy up to the first token (None where the window was not
    # split there).
    prefill_energy_j: NotRequired[float | None]
    sources: list[dict[str, object]]


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    request: Request
    chat: bool
    stream: bool
    include_usage: bool
    id: str


def _text(content: str | list[_ContentPart] | None, index: int) -> str:
    """A message's content: a string, or text parts (images are refused)."""
    if content is None or isinstance(content, str):
        return content or ""
    if any(part.type != "text" for part in content):
        param = f"messages.{index}.content"
        raise BadRequest(f"'{param}': only text content parts are supported", param)
    return "".join(part.text for part in content)


def _schema(response_format: _ResponseFormat | None) -> dict[str, object] | None:
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return {"type": "object"}
    if response_format.json_schema is None:
        param = "response_format.json_schema"
        raise BadRequest(f"'{param}': needs json_schema.schema for type json_schema", param)
    return response_format.json_schema.schema_


def serves_model(requested: str | None, served: str) -> bool:
    """Whether a body's `model` names the served model: left out, its name in any case, or a
    path to its file (`.../gemma-3-270m-q4_k_m.gguf`, as `--model PATH` clients send)."""
    if not requested:
        return True
    stem = PurePath(requested).name.removesuffix(".gguf")
    return served.casefold() in (requested.casefold(), stem.casefold())


def parse_request(body: ChatBody | CompletionBody) -> ParsedRequest:
    """A validated body as an engine request; BadRequest for what the engines cannot do."""
    unsupported = [name for name in _UNSUPPORTED if getattr(body, name)]
    unsupported += [name for name in ("n", "best_of") if getattr(body, name) not in (None, 1)]
    if unsupported:
        raise BadRequest(f"'{unsupported[0]}' is not supported by jarvis serve", unsupported[0])
    stop = body.stop
    options = _RequestOptions(
        max_tokens=body.max_completion_tokens or body.max_tokens,
        stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
        temperature=1.0 if body.temperature is None else float(body.temperature),
        seed=body.seed,
        json_schema=_schema(body.response_format),
    )
    request: Request
    if isinstance(body, ChatBody):
        messages = tuple(
            ChatMessage(_ROLES[message.role], _text(message.content, index))
            for index, message in enumerate(body.messages)
        )
        request = ChatRequest(messages, **options)
        prefix = "chatcmpl"
    else:
        assert isinstance(body.prompt, str), "the validator leaves one string"
        request = GenerationRequest(body.prompt, **options)
        prefix = "cmpl"
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    return ParsedRequest(
        request,
        isinstance(body, ChatBody),
        body.stream,
        include_usage,
        f"{prefix}-{uuid.uuid4().hex}",
    )


def energy_field(window: WindowEnergy, estimate: EnergyEstimate | None) -> EnergyField:
    """The `energy` extra field: joules per source with method; an estimate replaces the meter."""
    if estimate is not None:
        source: dict[str, object] = {
            "source": estimate.source,
            "domain": "cloud",
            "method": "estimate",
            "energy_j": estimate.energy_j,
            "net_energy_j": None,
            "null_reason": None,
        }
        return {
            "energy_j": estimate.energy_j,
            "net_energy_j": None,
            "method": "estimate",
            "scope": window.scope,
            "null_reason": None,
            "duration_s": window.duration_s,
            "shared": False,  # modelled from this request's own tokens
            "mean_batch": None,
            "basis": estimate.basis,
            "sources": [source],
        }
    sources: list[dict[str, object]] = [
        {
            "source": s.source,
            "domain": s.domain,
            "method": s.method,
            "energy_j": s.energy_j,
            "net_energy_j": s.net_energy_j,
            "null_reason": s.null_reason,
        }
        for s in window.sources
    ]
    return {
        "energy_j": window.energy_j,
        "net_energy_j": window.net_energy_j,
        "method": window.method,
        "scope": window.scope,
        "null_reason": window.null_reason,
        "duration_s": window.duration_s,
        "shared": window.shared,
        "mean_batch": window.mean_batch,
        "low_resolution": window.low_resolution,
        "prefill_energy_j": window.prefill_energy_j,
        "sources": sources,
    }


def _usage(completion: Completion) -> dict[str, object]:
    """OpenAI's usage; `prompt_tokens_details.cached_tokens` (the prompt tokens the engine took
    from its cache) only from an engine that says it, as OpenAI leaves the details out."""
    usage: dict[str, object] = {
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
    }
    if completion.cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": completion.cached_tokens}
    return usage


def _timings(completion: Completion) -> dict[str, float | None]:
    return {
        "ttft_s": completion.ttft_s,
        "prefill_tokens_per_s": completion.prefill_tokens_per_s,
        "decode_tokens_per_s": completion.decode_tokens_per_s,
        "wall_s": completion.wall_s,
        "memory_bandwidth_utilisation": completion.memory_bandwidth_utilisation,
    }


def completion_body(
    parsed: ParsedRequest, model: str, completion: Completion, energy: EnergyField
) -> dict[str, object]:
    if parsed.chat:
        choice: dict[str, object] = {
            "index": 0,
            "logprobs": None,
            "message": {"role": "assistant", "content": completion.text},
            "finish_reason": completion.finish_reason,
        }
        kind = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": completion.text,
            "logprobs": None,
            "finish_reason": completion.finish_reason,
        }
        kind = "text_completion"
    return {
        "id": parsed.id,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(completion),
        "energy": energy,
        "timings": _timings(completion),
        "cost_usd": completion.cost_usd,
    }


def chunk_body(
    parsed: ParsedRequest,
    model: str,
    text: str | None,
    finish_reason: str | None = None,
    completion: Completion | None = None,
    energy: EnergyField | None = None,
) -> dict[str, object]:
    """One stream chunk. `text` None with a completion makes the usage chunk (no choices)."""
    body: dict[str, object] = {
        "id": parsed.id,
        "created": int(time.time()),
        "model": model,
        "object": "chat.completion.chunk" if parsed.chat else "text_completion",
    }
    if text is None:
        body["choices"] = []
    elif parsed.chat:
        delta: dict[str, str] = {}
        if text:
            delta = {"content": text}
        elif not finish_reason:
            delta = {"role": "assistant", "content": ""}  # the stream's first chunk names the role
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        body["choices"] = [choice]
    else:
        body["choices"] = [
            {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
        ]
    if completion is not None:
        body["usage"] = _usage(completion)
        body["timings"] = _timings(completion)
        body["cost_usd"] = completion.cost_usd
    if energy is not None:
        body["energy"] = energy
    return body
