"""A stream's text chunks, encoded once with a placeholder and filled per text, are the bytes
the whole chunk's encoding gives, whatever the text holds."""

import json

import pytest

from openjarvis.runtime.types import GenerationRequest
from openjarvis.serve.protocol import ParsedRequest, chunk_body
from openjarvis.serve.server import _event, _text_events

TEXTS = ["hello", ' "quoted"\n', "é\u2028\\", "\x00", "🙂 \t", "null"]


@pytest.mark.parametrize("chat", [False, True])
def test_text_events_are_the_whole_chunks_bytes(
    chat: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("time.time", lambda: 1_700_000_000.5)  # one `created` for both
    parsed = ParsedRequest(GenerationRequest("x", 8), chat, True, False, "cmpl-0123")
    text_event = _text_events(parsed, "gemma-3-270m")
    for text in TEXTS:
        event = text_event(text)
        assert event == _event(chunk_body(parsed, "gemma-3-270m", text))
        assert event.startswith(b"data: ") and event.endswith(b"\n\n")
        body = json.loads(event[len(b"data: ") :])
        choice = body["choices"][0]
        assert (choice["delta"]["content"] if chat else choice["text"]) == text
