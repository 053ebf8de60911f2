"""`usage.prompt_tokens_details.cached_tokens` in replies, as OpenAI reports it: present with
the count an engine gave, absent where the engine did not say (never a 0 it did not report)."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from openjarvis.runtime.types import Completion
from openjarvis.serve.protocol import (
    ChatBody,
    chunk_body,
    completion_body,
    energy_field,
    parse_request,
)
from openjarvis.store import log_request, open_store
from tests.serve.test_protocol import WINDOW
from tests.store.test_store_concurrency import request

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


def test_ipw_requests_shows_cached_tokens_and_the_prefill_joules_saved(tmp_path: Path) -> None:
    db = tmp_path / "ipw.db"
    with open_store(str(db)) as store:
        log_request(store, request(prompt_tokens=1000, cached_tokens=960, prefill_saved_j=11.25))
        log_request(store, request())
    env = {**os.environ, "COLUMNS": "220"}
    command = [sys.executable, "-m", "openjarvis", "requests", "--db", str(db)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    first, second = [line for line in done.stdout.splitlines() if "chat/completions" in line]
    assert "960/1000" in first and "≈11.2" in first
    assert "960" not in second and "≈" not in second  # unknown shows as —, never as 0
