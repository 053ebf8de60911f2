"""`jarvis serve` answering the official OpenAI client, with the real embedded model on loopback."""

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel

from openjarvis.power.claims import claim_sources
from openjarvis.runtime.cloud import CloudEngine, CloudSettings
from openjarvis.runtime.llamacpp import LlamaCppEngine, LlamaCppSettings
from openjarvis.runtime.models import resolve_model
from openjarvis.runtime.types import ChatMessage, ChatRequest, GenerationRequest
from openjarvis.serve import EnergyServer, running_server
from openjarvis.store import Store, open_store, request_logs

KEY = "serve-test-key"
PROMPT = "Write a haiku about the sea."
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": PROMPT}]
METHODS = ("counter", "integrated", "estimate")


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    model = resolve_model(None)
    # A cold cache per request: reusing a prefix changes batch shapes and so greedy picks.
    settings = LlamaCppSettings(n_ctx=1024, reuse_prompt_cache=False)
    opened = LlamaCppEngine(model.path, settings, name=model.name)
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with open_store(str(tmp_path_factory.mktemp("serve") / "ipw.db")) as opened:
        yield opened


@pytest.fixture(scope="module")
def server(engine: LlamaCppEngine, store: Store) -> Iterator[EnergyServer]:
    with running_server(engine, store, api_key=KEY) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: EnergyServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0)


def _extra(reply: BaseModel) -> dict[str, Any]:
    """The fields the server adds to OpenAI's reply (`energy`, `timings`), as JSON."""
    assert reply.model_extra is not None
    return reply.model_extra


def _check_energy(energy: dict[str, Any], alone: bool = True) -> None:
    assert energy["method"] in METHODS
    assert energy["scope"] == "system"
    assert energy["sources"], "every energy figure names its sources"
    if alone:  # no window overlapped: its steps (if the engine reports them) were its own
        assert energy["shared"] is False and energy["mean_batch"] in (None, 1.0)
    if energy["energy_j"] is None:
        assert energy["null_reason"]
    else:
        assert float(energy["energy_j"]) > 0
    for source in energy["sources"]:
        assert source["method"] in METHODS and source["source"]


def test_binds_loopback_and_lists_the_model(server: EnergyServer, client: openai.OpenAI) -> None:
    assert server.url.startswith("http://127.0.0.1:")
    assert [m.id for m in client.models.list()] == ["gemma-3-270m-Q4_K_M"]


def test_chat_reply_carries_energy_and_matches_the_engine(
    client: openai.OpenAI, engine: LlamaCppEngine
) -> None:
    reply = client.chat.completions.create(
        model="gemma-3-270m-Q4_K_M",
        messages=MESSAGES,
        max_tokens=24,
        temperature=0,
    )
    direct = engine.generate(ChatRequest((ChatMessage("user", PROMPT),), max_tokens=24))
    assert reply.choices[0].message.content == direct.text
    assert reply.usage is not None and reply.usage.completion_tokens == direct.completion_tokens
    assert reply.choices[0].finish_reason == direct.finish_reason
    _check_energy(_extra(reply)["energy"])
    assert _extra(reply)["timings"]["ttft_s"] > 0


def test_chat_stream_yields_tokens_then_energy(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="gemma-3-270m-Q4_K_M",
        messages=MESSAGES,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    pieces = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(pieces) > 3, "tokens arrive one by one"
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1
    _check_energy(_extra(finish[0])["energy"])
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage is not None and usage.usage.completion_tokens > 0
    whole = client.chat.completions.create(
        model="gemma-3-270m-Q4_K_M",
        messages=MESSAGES,
        max_tokens=24,
        temperature=0,
    )
    assert "".join(pieces) == whole.choices[0].message.content


def test_plain_completions_stream_and_not(client: openai.OpenAI) -> None:
    prompt = "def add(a, b):\n"
    whole = client.completions.create(
        model="gemma-3-270m-Q4_K_M", prompt=prompt, max_tokens=16, temperature=0
    )
    streamed = client.completions.create(
        model="gemma-3-270m-Q4_K_M", prompt=prompt, max_tokens=16, temperature=0, stream=True
    )
    text = "".join(c.choices[0].text for c in streamed if c.choices)
    assert text == whole.choices[0].text and text
    _check_energy(_extra(whole)["energy"])


def test_json_schema_response_format(client: openai.OpenAI) -> None:
    schema: dict[str, object] = {
        "type": "object",
        "properties": {"sea": {"type": "string"}},
        "required": ["sea"],
    }
    reply = client.chat.completions.create(
        model="gemma-3-270m-Q4_K_M",
        messages=[{"role": "user", "content": "Name a sea as JSON."}],
        max_tokens=30,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    )
    assert isinstance(json.loads(reply.choices[0].message.content or "")["sea"], str)


def test_errors_reach_the_client_as_openai_errors(server: EnergyServer) -> None:
    wrong = openai.OpenAI(base_url=server.url, api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    right = openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="exceeds the model context"):
        right.chat.completions.create(
            model="gemma-3-270m-Q4_K_M",
            messages=MESSAGES,
            max_tokens=5000,
        )
    with pytest.raises(openai.BadRequestError, match="'tools' is not supported"):
        right.chat.completions.create(
            model="gemma-3-270m-Q4_K_M",
            messages=MESSAGES,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )


def test_cloud_engine_against_the_server(server: EnergyServer, engine: LlamaCppEngine) -> None:
    """The cloud engine's OpenAI dialect against a real OpenAI-compatible server."""
    # The per-token estimate, as for a remote API (on loopback it would be metered here).
    settings = CloudSettings("openai", "gemma-3-270m-Q4_K_M", base_url=server.url, meter="estimate")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPENAI_API_KEY", KEY)
        cloud = CloudEngine(settings)
    request = ChatRequest((ChatMessage("user", "Name three colours."),), max_tokens=20)
    chunks = list(cloud.stream(request))
    cloud.close()
    completion = chunks[-1].completion
    assert completion is not None
    assert completion.text == engine.generate(request).text
    assert len(chunks) > 3 and completion.decode_tokens_per_s is not None
    assert completion.energy_estimate is not None
    assert completion.energy_estimate.source == "estimate:cloud:small"
    assert completion.cost_usd is None


def test_requests_are_logged_with_their_energy(client: openai.OpenAI, store: Store) -> None:
    before = len(request_logs(store))
    client.chat.completions.create(
        model="gemma-3-270m-Q4_K_M",
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
    )
    logs = request_logs(store)
    assert len(logs) == before + 1
    last = logs[-1]
    assert (last.endpoint, last.engine, last.stream) == ("/v1/chat/completions", "llamacpp", False)
    assert last.completion_tokens > 0 and last.energy_method in METHODS
    assert last.energy_sources and (last.energy_j is not None or last.energy_null_reason)
    assert last.started_at is not None


def test_no_store_means_no_log(engine: LlamaCppEngine, tmp_path: Path) -> None:
    with running_server(engine, None) as bare:
        reply = openai.OpenAI(base_url=bare.url, api_key="x").completions.create(
            model="gemma-3-270m-Q4_K_M", prompt="1, 2, 3,", max_tokens=4, temperature=0
        )
    assert reply.choices[0].text


def test_the_server_claims_what_it_meters_so_a_measurement_beside_it_is_told(
    server: EnergyServer, engine: LlamaCppEngine
) -> None:
    beside = claim_sources(["estimate:cpu"], "ipw measure in a test")
    assert beside.held == []
    assert beside.taken["estimate:cpu"].endswith(f"jarvis serve on {engine.model_name}")


def test_concurrent_streams_batch_on_the_engine_and_share_their_energy(
    server: EnergyServer, engine: LlamaCppEngine, store: Store
) -> None:
    """As many streams as the engine batches, at once: each gets the text it gets alone
    (greedy), and each reply's energy is its share of the time they ran together."""
    prompts = [f"{n} + {n} =" for n in range(engine.concurrency)]
    alone = [engine.generate(GenerationRequest(p, max_tokens=16)).text for p in prompts]
    before = len(request_logs(store))

    async def one(client: openai.AsyncOpenAI, prompt: str) -> tuple[str, dict[str, Any]]:
        stream = await client.completions.create(
            model="gemma-3-270m-Q4_K_M", prompt=prompt, max_tokens=16, temperature=0, stream=True
        )
        pieces, energy = [], {}
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].text)
                if chunk.choices[0].finish_reason:
                    energy = (chunk.model_extra or {})["energy"]
        return "".join(pieces), energy

    async def together() -> list[tuple[str, dict[str, Any]]]:
        async with openai.AsyncOpenAI(base_url=server.url, api_key=KEY, max_retries=0) as client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    replies = asyncio.run(together())
    assert [text for text, _ in replies] == alone
    for _, energy in replies:
        _check_energy(energy, alone=False)
        assert energy["shared"] is True and float(energy["mean_batch"]) > 1
    logged = request_logs(store)[before:]
    assert len(logged) == len(prompts) and all(r.shared for r in logged)
