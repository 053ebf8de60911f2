"""`usage.prompt_tokens_details.cached_tokens` in replies, as OpenAI reports it: present with
the count an engine gave, absent where the engine did not say (never a 0 it did not report)."""

import dataclasses
import json

from openjarvis.runtime.types import Completion
from openjarvis.serve.protocol import (
    ChatBody,
    chunk_body,
    completion_body,
    energy_field,
    parse_request,
)
from tests.serve.test_protocol import WINDOW

COMPLETION = Completion("hi", 1200, 2, "stop", 1.0, 0.2, 0.8, cached_tokens=1184)


def _parsed():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
    return parse_request(ChatBody.model_validate_json(json.dumps(body)))


def test_a_reply_reports_the_cached_prompt_tokens() -> None:
    energy = energy_field(WINDOW, None)
    body = completion_body(_parsed(), "m", COMPLETION, energy)
    assert body["usage"] == {
        "prompt_tokens": 1200,
        "completion_tokens": 2,
        "total_tokens": 1202,
        "prompt_tokens_details": {"cached_tokens": 1184},
    }
    chunk = chunk_body(_parsed(), "m", None, None, COMPLETION, energy)
    assert chunk["usage"]["prompt_tokens_details"] == {"cached_tokens": 1184}  # type: ignore[index]


def test_an_engine_that_does_not_say_gets_no_details() -> None:
    unsaid = dataclasses.replace(COMPLETION, cached_tokens=None)
    body = completion_body(_parsed(), "m", unsaid, energy_field(WINDOW, None))
    assert "prompt_tokens_details" not in body["usage"]  # type: ignore[operator]
