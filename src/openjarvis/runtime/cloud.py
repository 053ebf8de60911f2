"""Cloud engines over httpx: OpenAI-compatible servers (OpenAI, vLLM, llama-server, Ollama's /v1,
LM Studio, `jarvis serve`) and Anthropic's messages API, streamed, with cost and energy estimate.

A server on this machine is metered here (no estimate): see `CloudEngine.metered_here`.
"""

import ipaddress
import os
import socket
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import psutil

from openjarvis.engine_kinds import LOCAL_ENGINE_KINDS
from openjarvis.errors import UserError
from openjarvis.reference import cost_usd
from openjarvis.runtime.cloud_http import CloudHttp, ServerEvent
from openjarvis.runtime.cloud_tables import estimate_energy
from openjarvis.runtime.token_count import GgufTokenCounter, tokenizer_file
from openjarvis.runtime.types import (
    ChatRequest,
    Completion,
    Engine,
    GenerationRequest,
    Request,
    StreamChunk,
    final_completion,
)

__all__ = [
    "CloudEngine",
    "CloudSettings",
    "MeterChoice",
    "Provider",
    "check_meter_choice",
    "measured_here",
    "on_this_machine",
]

Provider = Literal["openai", "anthropic"]
# How a served model's energy is obtained: "local" meters this machine's sources (the server runs
# here), "estimate" uses the per-token table, "auto" picks local when the URL is this machine.
MeterChoice = Literal["auto", "local", "estimate"]
METER_CHOICES: tuple[MeterChoice, ...] = ("auto", "local", "estimate")
_DEFAULTS: dict[Provider, tuple[str, str]] = {  # base URL, environment variable of the key
    "openai": ("https://api.openai.com/v1", "OPENAI_API_KEY"),
    "anthropic": ("https://api.anthropic.com/v1", "ANTHROPIC_API_KEY"),
}
_ANTHROPIC_VERSION = "2023-06-01"
_ANTHROPIC_DEFAULT_MAX_TOKENS = 4096
_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"}


@dataclass(frozen=True, slots=True)
class CloudSettings:
    provider: Provider
    model: str
    base_url: str | None = None  # None: the provider's public API
    api_key_env: str | None = None  # None: OPENAI_API_KEY or ANTHROPIC_API_KEY
    timeout_s: float = 120.0
    max_retries: int = 4
    meter: MeterChoice = "auto"


def check_meter_choice(provider: str, meter: str) -> None:
    """--meter's value for a cloud engine of `provider`, refused in one line where it cannot
    be (ipw measure checks it with the rest of its configuration, before anything opens)."""
    if meter not in METER_CHOICES:
        raise UserError(f"--meter takes {', '.join(METER_CHOICES)} (got {meter!r})")
    if meter == "local" and provider != "openai":  # Anthropic's API is never served here
        raise UserError(
            "--meter local is for OpenAI-compatible servers on this machine: use "
            "--engine openai, or --meter estimate"
        )


def on_this_machine(url: str) -> bool:
    """Whether `url`'s host is this machine: loopback, its host name, or one of its addresses."""
    host = (urlsplit(url).hostname or "").lower()
    if host in ("localhost", socket.gethostname().lower()):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name other than ours: not resolved, so as not to wait on DNS
    if address.is_loopback or address.is_unspecified:
        return True
    own = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    return str(address) in own


@dataclass(slots=True)
class _Outcome:
    """What a stream's events said besides text: token usage and why it ended."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str = "stop"


class CloudEngine:
    """A model behind an HTTP API. The API key is read from the environment, held in the
    client's headers only, and never put in settings, messages or logs."""

    def __init__(self, settings: CloudSettings) -> None:
        if settings.provider not in _DEFAULTS:
            raise UserError(
                f"unknown cloud provider {settings.provider!r}; use openai or anthropic"
            )
        default_url, default_env = _DEFAULTS[settings.provider]
        self.settings = settings
        self._key_env = settings.api_key_env or default_env
        key = os.environ.get(self._key_env) or None
        headers = {"accept": "text/event-stream"}
        if settings.provider == "anthropic":
            headers["anthropic-version"] = _ANTHROPIC_VERSION
            if key:
                headers["x-api-key"] = key
        elif key:
            headers["authorization"] = f"Bearer {key}"
        self._http = CloudHttp(
            settings.base_url or default_url,
            headers,
            secret=key,
            key_hint=f"set {self._key_env} or pass --api-key-env NAME",
            timeout_s=settings.timeout_s,
            max_retries=settings.max_retries,
        )
        self.metered_here = self._metered_here(settings)
        self.server: dict[str, object] | None = None  # which server answered (metered here)
        self._counter: GgufTokenCounter | None = None
        if self.metered_here:
            self.server = self._identify_server()
            names = [settings.model, *_model_ids(self.server)]
            path = tokenizer_file(names)
            self._counter = GgufTokenCounter(path) if path is not None else None

    @property
    def tokenizer_path(self) -> Path | None:
        """The GGUF whose tokenizer counts tokens when the server sends no usage."""
        return self._counter.path if self._counter is not None else None

    @property
    def counted_completions(self) -> int:
        """Replies whose tokens we counted with the GGUF because the server sent no usage."""
        return self._counter.counted if self._counter is not None else 0

    def _metered_here(self, settings: CloudSettings) -> bool:
        check_meter_choice(settings.provider, settings.meter)
        if settings.meter == "estimate":
            return False
        if settings.provider != "openai":  # Anthropic's API is never served on this machine
            return False
        if settings.meter == "local":
            return True
        return settings.base_url is not None and on_this_machine(settings.base_url)

    def _identify_server(self) -> dict[str, object]:
        """What /models and the `server` header say, stored with the run; never fatal (servers
        without /models still serve)."""
        try:
            listing = self._http.get_json("/models")
        except UserError as error:
            return {"models": None, "reason": str(error), "header": self._http.server_header}
        data = listing.get("data") if isinstance(listing, dict) else None
        models = [str(m["id"]) for m in data or [] if isinstance(m, dict) and "id" in m]
        return {"models": models, "header": self._http.server_header}

    # Requests are independent HTTP calls; 8 in flight stays inside common API rate limits.
    concurrency = 8

    @property
    def kind(self) -> str:
        return self.settings.provider

    @property
    def model_name(self) -> str:
        return self.settings.model

    @property
    def devices(self) -> tuple[int, ...]:
        return ()  # it computes elsewhere: no GPU here is in its energy scope

    @property
    def ledger(self) -> None:
        return None  # no steps of its own to file: requests that overlap split by time

    def settings_dict(self) -> dict[str, object]:
        settings: dict[str, object] = {
            "base_url": self._http.base_url,
            "api_key_env": self._key_env,  # the variable's name, never its value
            "timeout_s": self.settings.timeout_s,
            "max_retries": self.settings.max_retries,
            "meter": "local" if self.metered_here else "estimate",
        }
        if self.metered_here:
            settings["server"] = self.server
            counter = self._counter
            settings["token_counts"] = "usage" + (
                f", else counted with {counter.path}" if counter else ", else unknown"
            )
        return settings

    def generate(self, request: Request) -> Completion:
        return final_completion(self.stream(request))

    def stream(self, request: Request) -> Generator[StreamChunk]:
        start_s = time.monotonic()
        path, body = self._body(request)
        outcome = _Outcome()
        text: list[str] = []
        arrivals_s: list[float] = []
        read = _openai_event if self.settings.provider == "openai" else _anthropic_event
        with self._http.events(path, body) as events:
            for event in events:
                piece = read(event, outcome)
                if piece:
                    now_s = time.monotonic()
                    arrivals_s.append(now_s)
                    text.append(piece)
                    yield StreamChunk(piece, now_s)
        completion = self._completion(request, "".join(text), outcome, arrivals_s, start_s)
        yield StreamChunk("", time.monotonic(), completion)

    def _completion(
        self,
        request: Request,
        text: str,
        outcome: _Outcome,
        arrivals_s: list[float],
        start_s: float,
    ) -> Completion:
        end_s = time.monotonic()
        prompt, generated = self._token_counts(request, text, outcome)
        model = self.settings.model
        return Completion(
            text=text,
            prompt_tokens=prompt,
            completion_tokens=generated,
            finish_reason=outcome.finish_reason,
            wall_s=end_s - start_s,
            ttft_s=arrivals_s[0] - start_s if arrivals_s else None,
            # Servers batch several tokens into one event, so the decode time spans the events
            # while the rate divides by the tokens the server counted.
            decode_s=arrivals_s[-1] - arrivals_s[0] if arrivals_s else None,
            # A server on this machine is metered by its windows and charges nothing.
            cost_usd=None if self.metered_here else cost_usd(model, prompt, generated),
            energy_estimate=(
                None if self.metered_here else estimate_energy(model, prompt, generated)
            ),
        )

    def _token_counts(self, request: Request, text: str, outcome: _Outcome) -> tuple[int, int]:
        """The server's usage; else, for a server metered here, our count with its GGUF."""
        if outcome.prompt_tokens is not None and outcome.completion_tokens is not None:
            return outcome.prompt_tokens, outcome.completion_tokens
        if self._counter is not None:
            prompt, reply = self._counter.count(request, text)
            # What the server did send stands; only a missing count is ours.
            sent_prompt, sent_reply = outcome.prompt_tokens, outcome.completion_tokens
            return (
                prompt if sent_prompt is None else sent_prompt,
                reply if sent_reply is None else sent_reply,
            )
        if self.metered_here:
            # Completion's counts are ints, so an unknown count cannot be stored as null yet.
            raise UserError(
                f"{self._http.base_url} sent no token usage and no GGUF for its model was found "
                "to count them; pass --model PATH.gguf (the file the server loaded)"
            )
        raise UserError(
            f"{self._http.base_url} sent no token usage (or only part of it) with its "
            "stream; energy and cost need both counts: use a server that honours "
            "stream_options.include_usage"
        )

    def _body(self, request: Request) -> tuple[str, dict[str, object]]:
        common: dict[str, object] = {
            "model": self.settings.model,
            "temperature": request.temperature,
            "stream": True,
        }
        if request.max_tokens is not None:
            common["max_tokens"] = request.max_tokens
        elif self.settings.provider == "anthropic":
            common["max_tokens"] = _ANTHROPIC_DEFAULT_MAX_TOKENS  # the API requires one
        if request.stop:
            common["stop_sequences" if self.settings.provider == "anthropic" else "stop"] = list(
                request.stop
            )
        if self.settings.provider == "anthropic":
            return "/messages", {**common, **_anthropic_messages(request)}
        common["stream_options"] = {"include_usage": True}
        if request.seed is not None:
            common["seed"] = request.seed
        if request.json_schema is not None:
            common["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": request.json_schema, "strict": True},
            }
        if isinstance(request, GenerationRequest):
            return "/completions", {**common, "prompt": request.prompt}
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        return "/chat/completions", {**common, "messages": messages}

    def close(self) -> None:
        self._http.close()
        if self._counter is not None:
            self._counter.close()


def _openai_event(event: ServerEvent, outcome: _Outcome) -> str:
    usage = event.data.get("usage")
    if isinstance(usage, dict):
        outcome.prompt_tokens = _token_count(usage, "prompt_tokens")
        outcome.completion_tokens = _token_count(usage, "completion_tokens")
    piece = ""
    for choice in event.data.get("choices") or []:
        delta = choice.get("delta")
        piece += (delta.get("content") or "") if isinstance(delta, dict) else choice.get("text", "")
        if choice.get("finish_reason"):
            outcome.finish_reason = str(choice["finish_reason"])
    return piece


def _anthropic_event(event: ServerEvent, outcome: _Outcome) -> str:
    data = event.data
    if event.name == "error" or data.get("type") == "error":
        message = data.get("error", {}).get("message", data)
        raise UserError(f"Anthropic stopped the stream: {str(message)[:200]}")
    if data.get("type") == "message_start":
        usage = data["message"].get("usage", {})
        outcome.prompt_tokens = _token_count(usage, "input_tokens")
        outcome.completion_tokens = _token_count(usage, "output_tokens")
    elif data.get("type") == "message_delta":
        # The final count; the start's is stale, so a delta without one leaves it unknown.
        outcome.completion_tokens = _token_count(data.get("usage", {}), "output_tokens")
        reason = data.get("delta", {}).get("stop_reason")
        outcome.finish_reason = _FINISH.get(str(reason), str(reason))
    elif data.get("type") == "content_block_delta":
        delta = data.get("delta", {})
        return str(delta.get("text", "")) if isinstance(delta, dict) else ""
    return ""


def _token_count(usage: object, name: str) -> int | None:
    """A usage field as an int; None when the server left it out (unknown, never 0)."""
    value = usage.get(name) if isinstance(usage, dict) else None
    return int(value) if value is not None else None


def _anthropic_messages(request: Request) -> dict[str, object]:
    if isinstance(request, GenerationRequest):
        raise UserError(
            "Anthropic's API has chat messages only, not plain completions; use an "
            "OpenAI-compatible engine (--engine openai) for completion suites"
        )
    if request.json_schema is not None:
        raise UserError("JSON-schema output is not available on the Anthropic engine; drop it")
    assert isinstance(request, ChatRequest)
    system = "\n\n".join(m.content for m in request.messages if m.role == "system")
    turns = [{"role": m.role, "content": m.content} for m in request.messages if m.role != "system"]
    return {"messages": turns, **({"system": system} if system else {})}


def _model_ids(server: dict[str, object] | None) -> list[str]:
    models = server.get("models") if server else None
    return [str(model) for model in models] if isinstance(models, list) else []


def measured_here(engine: Engine) -> bool:
    """Whether this machine's sources measure the engine's energy: a local engine, or a server
    on this machine (`CloudEngine.metered_here`); otherwise it is the per-token estimate."""
    return engine.kind in LOCAL_ENGINE_KINDS or (
        isinstance(engine, CloudEngine) and engine.metered_here
    )
