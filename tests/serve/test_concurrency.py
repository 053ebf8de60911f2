"""Requests served at once: the official openai client's concurrent streams against a batching
engine faked at the model's edge, a client that leaves, a full line answered 429, an engine of
concurrency 1 taking requests in turn. The server, the meter and the store run for real."""

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from openjarvis.errors import UserError
from openjarvis.serve import running_server
from openjarvis.store import Store, open_store, request_logs
from tests.serve.batching_fake import FakeBatchingEngine, echo_reply


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(str(tmp_path / "ipw.db")) as opened:
        yield opened


def _long_for_long(prompt: str) -> str:
    """200 words (10 s at 0.05 s a step) for the prompt "long": far longer than any wait here,
    so a sequence freed in time was freed by the client leaving, not by its end."""
    return "word " * 200 if prompt == "long" else echo_reply(prompt)


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline_s, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_sixteen_concurrent_streams_of_the_openai_client(store: Store) -> None:
    # The fake holds every sequence until 16 are in flight: served in turn, this fails.
    engine = FakeBatchingEngine(concurrency=16, gather=16)
    prompts = [f"question {index}" for index in range(16)]
    with running_server(engine, store, max_concurrency=16) as server:

        async def one(client: openai.AsyncOpenAI, prompt: str) -> tuple[str, dict[str, object]]:
            stream = await client.chat.completions.create(
                model="fake-batching", messages=[{"role": "user", "content": prompt}], stream=True
            )
            pieces, energy = [], {}
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
                if chunk.choices and chunk.choices[0].finish_reason:
                    energy = (chunk.model_extra or {})["energy"]
            return "".join(pieces), energy

        async def all_at_once() -> list[tuple[str, dict[str, object]]]:
            client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
            async with client:
                return await asyncio.gather(*(one(client, p) for p in prompts))

        replies = asyncio.run(all_at_once())
    assert [text for text, _ in replies] == [echo_reply(p) for p in prompts]
    assert engine.peak == 16 and engine.active == 0
    for _, energy in replies:
        assert energy["shared"] is True  # split with the others by the work each did
        assert isinstance(energy["mean_batch"], float) and energy["mean_batch"] > 8
    logged = request_logs(store)
    assert len(logged) == 16 and all(r.shared and (r.mean_batch or 0) > 8 for r in logged)


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_frees_its_sequence(store: Store, stream: bool) -> None:
    engine = FakeBatchingEngine(_long_for_long, concurrency=4, step_s=0.05)
    with running_server(engine, store) as server:
        body = {"model": "fake-batching", "prompt": "long", "stream": stream}
        url = f"{server.url}/completions"
        if stream:
            with httpx.stream("POST", url, json=body, timeout=10) as response:
                assert response.status_code == 200
                next(response.iter_lines())  # the first token has come: then hang up
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url, json=body, timeout=0.2)
        _until(lambda: engine.freed == 1, "the engine to free the sequence", timeout_s=2)
        assert engine.active == 0
        # The slot is free again, and the next request is answered whole.
        short = {"prompt": "short", "stream": False}
        reply = httpx.post(url, json=short, timeout=10).json()
        assert reply["choices"][0]["text"] == echo_reply("short")
    assert len(request_logs(store)) == 1  # the abandoned request is not logged


def test_a_full_line_is_answered_429_and_concurrency_1_takes_turns(store: Store) -> None:
    engine = FakeBatchingEngine(concurrency=1)
    engine.flowing.clear()  # the first request holds the engine
    with running_server(engine, store, max_concurrency=8, max_queue=1) as server:
        assert server.admission.slots == 1  # min(--max-concurrency, the engine's 1)
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
        texts: list[str] = []

        def ask(prompt: str) -> None:
            reply = client.completions.create(model="fake-batching", prompt=prompt)
            texts.append(reply.choices[0].text)

        first = threading.Thread(target=ask, args=("first",))
        first.start()
        _until(lambda: engine.active == 1, "the first request to generate")
        second = threading.Thread(target=ask, args=("second",))
        second.start()
        _until(lambda: server.admission.waiting == 1, "the second request to wait")
        with pytest.raises(openai.RateLimitError, match="at capacity") as refused:
            client.completions.create(model="fake-batching", prompt="third")
        assert refused.value.response.headers["retry-after"] == "1"
        assert isinstance(refused.value.body, dict)  # the error object of the JSON reply
        assert refused.value.body["type"] == "rate_limit_error"
        engine.flowing.set()
        first.join(timeout=10)
        second.join(timeout=10)
    assert sorted(texts) == sorted([echo_reply("first"), echo_reply("second")])
    assert engine.peak == 1  # one at a time, as an engine of concurrency 1 needs
    logged = request_logs(store)
    assert len(logged) == 2 and not any(r.shared for r in logged)


def test_a_client_that_leaves_the_line_never_reaches_the_engine() -> None:
    engine = FakeBatchingEngine(concurrency=1)
    engine.flowing.clear()
    with running_server(engine, None, max_queue=4) as server:
        url = f"{server.url}/completions"
        first = threading.Thread(target=httpx.post, args=(url,), kwargs={"json": {"prompt": "a"}})
        first.start()
        _until(lambda: engine.active == 1, "the first request to generate")
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, json={"prompt": "b"}, timeout=0.3)
        _until(lambda: server.admission.waiting == 0, "the line to empty")
        engine.flowing.set()
        first.join(timeout=10)
        reply = httpx.post(url, json={"prompt": "c"}, timeout=10).json()
    assert reply["choices"][0]["text"] == echo_reply("c")
    assert engine.started == 2  # "b" left before its turn: the engine never saw it


def test_shutdown_ends_streams_in_flight_before_the_engine_closes() -> None:
    engine = FakeBatchingEngine(_long_for_long, concurrency=2, step_s=0.05)
    started_s = time.monotonic()
    with running_server(engine, None) as server:
        leaving = httpx.stream(
            "POST", f"{server.url}/completions", json={"prompt": "long", "stream": True}
        )
        response = leaving.__enter__()
        next(response.iter_lines())
        _until(lambda: engine.active == 1, "the stream to be generating")
    assert engine.active == 0  # shutdown returned only once the generator was closed
    assert time.monotonic() - started_s < 8  # closed, not run to its end
    leaving.__exit__(None, None, None)


def test_a_stream_that_fails_keeps_the_text_before_and_ends_with_an_error_event() -> None:
    """Chunks reach the client in batches: those the engine produced before failing (here in
    one batch with the failure, the steps taking no time) come first, then the error event."""
    engine = FakeBatchingEngine(step_s=0.0, fail_after=3)
    with running_server(engine, None) as server:
        body = {"prompt": "x", "stream": True}
        with httpx.stream("POST", f"{server.url}/completions", json=body) as response:
            events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error" and "internal error" in error["message"]
    text = "".join(json.loads(event)["choices"][0]["text"] for event in events[:-2])
    assert text == "".join(echo_reply("x").split(" ")[i] + " " for i in range(3))
    assert engine.freed == 1


def test_server_options_are_checked() -> None:
    engine = FakeBatchingEngine()
    refused = pytest.raises(UserError, match="--max-concurrency must be at least 1, not 0")
    with refused, running_server(engine, None, max_concurrency=0):
        pass
    with running_server(engine, None) as server:
        port = int(server.url.split(":")[2].split("/")[0])
        taken = pytest.raises(UserError, match=f"cannot listen on 127.0.0.1:{port}.*--port")
        with taken, running_server(engine, None, port=port):
            pass
