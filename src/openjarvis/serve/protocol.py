"""The OpenAI wire format of `jarvis serve`: request bodies to engine requests, and completions
plus energy back to response bodies and stream chunks (with the extra `energy` field).
"""

import time
import uuid
from dataclasses import dataclass
from typing import NotRequired, TypedDict

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
    "EnergyField",
    "ParsedRequest",
    "chunk_body",
    "completion_body",
    "energy_field",
    "parse_request",
]

_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}
_UNSUPPORTED = ("tools", "functions", "logprobs", "top_logprobs", "echo", "suffix")


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
    basis: NotRequired[str]  # a cloud estimate's constants
    low_resolution: NotRequired[bool]  # the meter's windows only
    sources: list[dict[str, object]]


class BadRequest(Exception):
    """A request the server cannot serve: answered 400 with this message."""


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    request: Request
    chat: bool
    stream: bool
    include_usage: bool
    id: str


def _text(content: object) -> str:
    """A message's content: a string, or a list of text parts (images are refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise BadRequest("only text content parts are supported")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    if content is None:
        return ""
    raise BadRequest("message content must be a string or a list of text parts")


def _messages(raw: object) -> tuple[ChatMessage, ...]:
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list")
    messages = []
    for item in raw:
        role = _ROLES.get(str(item.get("role"))) if isinstance(item, dict) else None
        if role is None:
            raise BadRequest("each message needs a role of system, developer, user or assistant")
        messages.append(ChatMessage(role, _text(item.get("content"))))
    return tuple(messages)


def _schema(response_format: object) -> dict[str, object] | None:
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema" and isinstance(response_format, dict):
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if isinstance(schema, dict):
            return schema
    raise BadRequest("response_format must be text, json_object or json_schema with a schema")


def _number(body: dict[str, object], name: str, default: float | None) -> float | None:
    value = body.get(name)
    if value is None:  # absent or JSON null: the API's default
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"'{name}' must be a number")
    return value


def parse_request(body: object, chat: bool) -> ParsedRequest:
    """An OpenAI chat or completions body as an engine request; BadRequest when unusable."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unsupported = [name for name in _UNSUPPORTED if body.get(name)]
    unsupported += [name for name in ("n", "best_of") if body.get(name, 1) != 1]
    if unsupported:
        raise BadRequest(f"'{unsupported[0]}' is not supported by jarvis serve")
    max_tokens = _number(body, "max_completion_tokens", None) or _number(body, "max_tokens", None)
    if max_tokens is not None and (int(max_tokens) != max_tokens or max_tokens < 1):
        raise BadRequest("'max_tokens' must be a positive integer")
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str | list):
        raise BadRequest("'stop' must be a string or a list of strings")
    stops = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop or [])
    seed = _number(body, "seed", None)
    shared = _RequestOptions(
        max_tokens=None if max_tokens is None else int(max_tokens),
        stop=stops,
        temperature=float(_number(body, "temperature", 1.0) or 0.0),  # OpenAI's default: 1
        seed=None if seed is None else int(seed),
        json_schema=_schema(body.get("response_format")),
    )
    if chat:
        request: Request = ChatRequest(_messages(body.get("messages")), **shared)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise BadRequest("'prompt' must be a string")
        request = GenerationRequest(prompt, **shared)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    prefix = "chatcmpl" if chat else "cmpl"
    return ParsedRequest(
        request, chat, bool(body.get("stream")), include_usage, f"{prefix}-{uuid.uuid4().hex}"
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
        "low_resolution": window.low_resolution,
        "sources": sources,
    }


def _usage(completion: Completion) -> dict[str, int]:
    return {
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
    }


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
