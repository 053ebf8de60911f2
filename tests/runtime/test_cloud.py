"""The cloud engine against a scripted server on loopback: formats, retries, keys, cost, energy."""

import logging
from typing import get_args

import pytest

from openjarvis.engine_kinds import CLOUD_ENGINE_KINDS
from openjarvis.errors import UserError
from openjarvis.reference import cost_usd, energy_class
from openjarvis.runtime.cloud import CloudEngine, CloudSettings, Provider
from openjarvis.runtime.cloud_tables import estimate_energy
from openjarvis.runtime.types import ChatMessage, ChatRequest, GenerationRequest
from tests.runtime.stub_server import Reply, sse, stub_server

SECRET = "sk-test-0123456789abcdef"
HELLO = ChatRequest((ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")), max_tokens=8)


def _openai_reply(*pieces: str, usage: bool = True) -> Reply:
    events: list[dict[str, object]] = [
        {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
        for piece in pieces
    ]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    if usage:
        events.append({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3}})
    return sse(*events)


def _engine(url: str, provider: Provider = "openai", model: str = "gpt-4o") -> CloudEngine:
    # The stub stands in for a remote API: on loopback it would otherwise be metered here.
    settings = CloudSettings(provider, model, base_url=url, max_retries=2, meter="estimate")
    return CloudEngine(settings)


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)


def test_openai_chat_stream_usage_cost_and_estimate() -> None:
    with stub_server([_openai_reply("Hel", "lo", "!")]) as stub:
        engine = _engine(stub.url)
        chunks = list(engine.stream(HELLO))
        engine.close()
    path, headers, body = stub.requests[0]
    assert path == "/v1/chat/completions"
    assert headers["authorization"] == f"Bearer {SECRET}"
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["stream_options"] == {"include_usage": True}
    assert [c.text for c in chunks] == ["Hel", "lo", "!", ""]
    completion = chunks[-1].completion
    assert completion is not None
    assert (completion.text, completion.finish_reason) == ("Hello!", "length")
    assert (completion.prompt_tokens, completion.completion_tokens) == (12, 3)
    assert completion.ttft_s is not None and completion.ttft_s <= completion.wall_s
    assert completion.cost_usd == pytest.approx((12 * 2.50 + 3 * 10.00) / 1e6)
    estimate = completion.energy_estimate
    assert estimate is not None and estimate.source == "estimate:cloud:frontier"
    assert estimate.energy_j == pytest.approx((3 * 2.16 + 12 * 0.79) * 1.15)
    assert "PUE 1.15" in estimate.basis


def test_plain_completion_goes_to_completions_with_schema_and_stop() -> None:
    schema: dict[str, object] = {"type": "object"}
    request = GenerationRequest("def f():", max_tokens=4, stop=("\n\n",), json_schema=schema)
    reply = sse(
        {"choices": [{"index": 0, "text": " pass", "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    )
    with stub_server([reply]) as stub:
        completion = _engine(stub.url, model="llama-3.1-8b").generate(request)
    path, _, body = stub.requests[0]
    assert path == "/v1/completions"
    assert body["prompt"] == "def f():" and body["stop"] == ["\n\n"]
    assert body["response_format"]["json_schema"]["schema"] == schema
    assert completion.text == " pass"
    assert completion.cost_usd is None  # no price for a self-hosted model
    assert completion.energy_estimate is not None
    assert completion.energy_estimate.source == "estimate:cloud:small"


def test_retries_429_and_5xx_then_succeeds() -> None:
    replies = [Reply(429, b"{}", {"retry-after": "0"}), Reply(503, b"{}"), _openai_reply("ok")]
    with stub_server(replies) as stub:
        completion = _engine(stub.url).generate(HELLO)
    assert completion.text == "ok"
    assert len(stub.requests) == 3


def test_gives_up_after_the_retries_with_one_line() -> None:
    failing = stub_server([Reply(500, b'{"error": {"message": "boom"}}')] * 3)
    with failing as stub, pytest.raises(UserError, match=r"kept failing \(500: boom\) after 3"):
        _engine(stub.url).generate(HELLO)


def test_the_key_never_reaches_messages_logs_or_settings(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    echo = f'{{"error": {{"message": "bad request for key {SECRET}"}}}}'.encode()
    with stub_server([Reply(401, b"{}"), Reply(400, echo)]) as stub:
        engine = _engine(stub.url)
        with pytest.raises(UserError) as refused:
            engine.generate(HELLO)
        with pytest.raises(UserError) as rejected:
            engine.generate(HELLO)
    assert "OPENAI_API_KEY" in str(refused.value) and "--api-key-env" in str(refused.value)
    assert "***" in str(rejected.value)
    for text in (str(refused.value), str(rejected.value), caplog.text, str(engine.settings_dict())):
        assert SECRET not in text


def test_unreachable_server_is_a_user_error() -> None:
    with stub_server([]) as stub:
        url = stub.url
    with pytest.raises(UserError, match=r"cannot reach .* check --base-url"):
        _engine(url).generate(HELLO)


def test_stream_without_usage_is_refused_not_guessed() -> None:
    no_usage = stub_server([_openai_reply("x", usage=False)])
    with no_usage as stub, pytest.raises(UserError, match="sent no token usage"):
        _engine(stub.url).generate(HELLO)


@pytest.mark.parametrize(
    "usage", [{"prompt_tokens": 12}, {"completion_tokens": 3}, {"prompt_tokens": None}]
)
def test_usage_missing_a_field_is_refused_not_counted_as_zero(usage: dict[str, object]) -> None:
    reply = sse(
        {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}]},
        {"choices": [], "usage": usage},
    )
    with stub_server([reply]) as stub, pytest.raises(UserError, match="only part of it"):
        _engine(stub.url).generate(HELLO)


def test_anthropic_delta_without_output_count_is_refused_not_the_stale_start_count() -> None:
    events = (
        {"type": "message_start", "message": {"usage": {"input_tokens": 9, "output_tokens": 1}}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}},
    )
    names = tuple(str(e["type"]) for e in events)
    with stub_server([sse(*events, names=names, done=False)]) as stub:
        engine = _engine(stub.url, provider="anthropic", model="claude-sonnet-4-20250514")
        with pytest.raises(UserError, match="sent no token usage"):
            engine.generate(HELLO)


def test_anthropic_messages_stream() -> None:
    events = (
        {"type": "message_start", "message": {"usage": {"input_tokens": 9, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 2},
        },
        {"type": "message_stop"},
    )
    names = tuple(str(e["type"]) for e in events)
    with stub_server([sse(*events, names=names, done=False)]) as stub:
        engine = _engine(stub.url, provider="anthropic", model="claude-sonnet-4-20250514")
        completion = engine.generate(HELLO)
    path, headers, body = stub.requests[0]
    assert path == "/v1/messages"
    assert headers["x-api-key"] == SECRET and headers["anthropic-version"]
    assert body["system"] == "Be brief."
    assert body["messages"] == [{"role": "user", "content": "Hi"}]
    assert (completion.text, completion.finish_reason) == ("Hi!", "stop")
    assert (completion.prompt_tokens, completion.completion_tokens) == (9, 2)
    assert completion.cost_usd == pytest.approx((9 * 3 + 2 * 15) / 1e6)


def test_anthropic_refuses_plain_completions() -> None:
    engine = _engine("http://127.0.0.1:9/v1", provider="anthropic", model="claude-opus-4")
    with pytest.raises(UserError, match="chat messages only"):
        engine.generate(GenerationRequest("x", max_tokens=1))


def test_price_and_energy_tables() -> None:
    assert cost_usd("gpt-4o-mini-2024-07-18", 1_000_000, 0) == pytest.approx(0.15)
    assert cost_usd("my-local-model", 10, 10) is None
    assert energy_class("qwen2.5-coder:7b").name == "small"
    assert energy_class("gemma-3-270m-Q4_K_M").name == "small"
    assert energy_class("claude-3-5-sonnet-latest").name == "frontier"
    assert estimate_energy("gpt-4o", 0, 0).energy_j == 0


def test_the_providers_are_the_cloud_engine_kinds() -> None:
    # The Literal is a type and cannot be built from the tuple; this keeps the two one list.
    assert get_args(Provider) == CLOUD_ENGINE_KINDS
