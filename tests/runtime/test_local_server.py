"""A server on this machine through the openai engine: metered here, not estimated; its tokens
counted with the GGUF when it sends no usage; which server answered kept with the settings."""

import json

import psutil
import pytest

from openjarvis.errors import UserError
from openjarvis.runtime.cloud import CloudEngine, CloudSettings, MeterChoice, on_this_machine
from openjarvis.runtime.models import DEFAULT_MODEL_NAME, embedded_default
from openjarvis.runtime.token_count import GgufTokenCounter
from openjarvis.runtime.types import ChatMessage, ChatRequest, GenerationRequest
from tests.runtime.stub_server import Reply, sse, stub_server

PROMPT = GenerationRequest("def add(a, b):\n", max_tokens=8)


def _reply(*pieces: str, usage: dict[str, int] | None = None) -> Reply:
    events: list[dict[str, object]] = [
        {"choices": [{"index": 0, "text": piece, "finish_reason": None}]} for piece in pieces
    ]
    events.append({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]})
    if usage is not None:
        events.append({"choices": [], "usage": usage})
    return sse(*events)


def _models(*ids: str) -> dict[str, Reply]:
    body = json.dumps({"object": "list", "data": [{"id": i, "object": "model"} for i in ids]})
    return {"/v1/models": Reply(200, body.encode(), {"content-type": "application/json"})}


def _engine(url: str, model: str, meter: MeterChoice = "auto") -> CloudEngine:
    return CloudEngine(CloudSettings("openai", model, base_url=url, max_retries=0, meter=meter))


def test_this_machine_is_loopback_its_name_and_its_addresses() -> None:
    assert on_this_machine("http://127.0.0.1:8080/v1")
    assert on_this_machine("http://127.3.4.5/v1")  # all of 127/8 is loopback
    assert on_this_machine("http://localhost:11434/v1")
    assert on_this_machine("http://[::1]:8000/v1")
    own = next(
        a.address
        for addresses in psutil.net_if_addrs().values()
        for a in addresses
        if a.family.name == "AF_INET" and not a.address.startswith("127.")
    )
    assert on_this_machine(f"http://{own}:8000/v1")
    assert not on_this_machine("https://api.openai.com/v1")
    assert not on_this_machine("http://192.0.2.7:8000/v1")  # TEST-NET-1: nobody's address


def test_a_server_here_is_metered_not_estimated_and_named() -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 2}
    with stub_server([_reply("    return", " a + b", usage=usage)], _models("served")) as stub:
        engine = _engine(stub.url, "served")
        completion = engine.generate(PROMPT)
        settings = engine.settings_dict()
        engine.close()
    assert engine.metered_here
    assert (completion.prompt_tokens, completion.completion_tokens) == (5, 2)
    assert completion.energy_estimate is None  # the window's energy stands
    assert completion.cost_usd is None
    assert settings["meter"] == "local"
    server = settings["server"]
    assert isinstance(server, dict) and server["models"] == ["served"]
    assert str(server["header"]).startswith("BaseHTTP/")  # http.server's own `server` header
    assert engine.counted_completions == 0  # the server's usage was used


def test_without_usage_the_gguf_counts_the_tokens() -> None:
    gguf = embedded_default().path
    pieces = ("    return", " a + b")
    with stub_server([_reply(*pieces)], _models(str(gguf))) as stub:
        engine = _engine(stub.url, "whatever-the-server-calls-it")
        completion = engine.generate(PROMPT)
        settings = engine.settings_dict()
        engine.close()
    counter = GgufTokenCounter(gguf)
    try:
        expected = (counter.prompt_tokens(PROMPT), counter.text_tokens("".join(pieces)))
    finally:
        counter.close()
    assert (completion.prompt_tokens, completion.completion_tokens) == expected
    assert expected[0] > 3 and expected[1] >= 2  # BOS and the prompt's words; the reply's
    assert engine.counted_completions == 1
    assert settings["token_counts"] == f"usage, else counted with {gguf}"


def test_a_count_the_server_sent_stands_and_only_the_missing_one_is_counted() -> None:
    gguf = embedded_default().path
    with stub_server(
        [_reply("    return", usage={"prompt_tokens": 99})], _models(str(gguf))
    ) as stub:
        engine = _engine(stub.url, str(gguf))
        completion = engine.generate(PROMPT)
        engine.close()
    assert completion.prompt_tokens == 99  # the server's, though our count differs
    assert completion.completion_tokens >= 1 and engine.counted_completions == 1


def test_the_embedded_models_name_finds_its_tokenizer_for_chat_too() -> None:
    chat = ChatRequest((ChatMessage("user", "Say hi"),), max_tokens=4)
    with stub_server([_reply("Hi")], {}) as stub:  # no /v1/models here: a 404
        engine = _engine(stub.url, DEFAULT_MODEL_NAME)
        completion = engine.generate(chat)
        server = engine.settings_dict()["server"]
        engine.close()
    assert isinstance(server, dict) and server["models"] is None and "404" in str(server["reason"])
    # The chat template adds turn markers: more tokens than the two words.
    assert completion.prompt_tokens > 4 and completion.completion_tokens == 1


def test_without_usage_or_a_gguf_it_says_what_to_pass() -> None:
    with stub_server([_reply("x")], _models("some-remote-name")) as stub:
        engine = _engine(stub.url, "some-remote-name")
        with pytest.raises(UserError, match=r"--model PATH\.gguf"):
            engine.generate(PROMPT)
        engine.close()


def test_meter_estimate_keeps_the_table_for_a_server_here() -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 2}
    with stub_server([_reply("x", usage=usage)]) as stub:
        engine = _engine(stub.url, "served", meter="estimate")
        completion = engine.generate(PROMPT)
        engine.close()
    assert not engine.metered_here
    assert completion.energy_estimate is not None
    assert completion.energy_estimate.source.startswith("estimate:cloud:")


def test_meter_local_is_refused_for_anthropic_and_unknown_choices() -> None:
    with pytest.raises(UserError, match="OpenAI-compatible"):
        CloudEngine(CloudSettings("anthropic", "claude", meter="local"))
    with pytest.raises(UserError, match="--meter takes auto, local, estimate"):
        CloudEngine(
            CloudSettings(
                "openai",
                "x",
                meter="nearby",  # type: ignore[arg-type]  # deliberately no meter choice
            )
        )
