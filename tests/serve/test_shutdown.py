"""Stopping `jarvis serve` (Ctrl-C) mid-stream: the client gets an error event and [DONE], not
a cut connection, and the server prints no traceback. Over HTTP, against the batching fake."""

import threading
import time

import httpx
import pytest

from openjarvis.serve import running_server
from tests.serve.batching_fake import FakeBatchingEngine
from tests.serve.test_concurrency import _long_for_long

__all__: list[str] = []


def test_a_stream_in_flight_ends_with_an_error_event_and_done_when_the_server_stops(
    capfd: pytest.CaptureFixture[str],
) -> None:
    engine = FakeBatchingEngine(_long_for_long, concurrency=2, step_s=0.05)
    lines: list[str] = []
    failures: list[BaseException] = []
    with running_server(engine, None) as server:
        body = {"model": "fake-batching", "prompt": "long", "stream": True}

        def read() -> None:
            try:
                url = f"{server.url}/completions"
                with httpx.stream("POST", url, json=body, timeout=30) as response:
                    lines.extend(line for line in response.iter_lines() if line)
            except httpx.HTTPError as error:
                failures.append(error)

        reader = threading.Thread(target=read)
        reader.start()
        deadline = time.monotonic() + 20
        while len(lines) < 3 and time.monotonic() < deadline:  # the stream is flowing
            time.sleep(0.02)
        assert len(lines) >= 3
    # Leaving the block shut the server down while the reply was still streaming.
    reader.join(timeout=20)
    assert failures == []
    assert lines[-1] == "data: [DONE]"
    assert lines[-2] == (
        'data: {"error": {"message": "the server is shutting down; the reply was cut short", '
        '"type": "server_error"}}'
    )
    assert "Traceback" not in capfd.readouterr().err
