"""`usage.prompt_tokens_details.cached_tokens` in replies, as OpenAI reports it: present with
the count an engine gave, absent where the engine did not say (never a 0 it did not report)."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from openjarvis.runtime.types import Completion
from openjarvis.serve import running_server
from openjarvis.serve.protocol import (
    ChatBody,
    chunk_body,
    completion_body,
    energy_field,
    parse_request,
)
from openjarvis.store import log_request, open_store, request_logs
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
    usage = chunk["usage"]
    assert isinstance(usage, dict)
    assert usage["prompt_tokens_details"] == {"cached_tokens": 1184}


def test_an_engine_that_does_not_say_gets_no_details() -> None:
    unsaid = dataclasses.replace(COMPLETION, cached_tokens=None)
    body = completion_body(_parsed(), "m", unsaid, energy_field(WINDOW, None))
    usage = body["usage"]
    assert isinstance(usage, dict)
    assert "prompt_tokens_details" not in usage


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


@pytest.mark.parametrize("engine_process", [False, True], ids=["in-process", "core-process"])
def test_jarvis_serve_on_the_torch_engine_reports_the_reused_prefix(
    tmp_path: Path, engine_process: bool
) -> None:
    """Two requests through the real server sharing a system prompt: the second's usage says
    how many of its prompt tokens the engine took from its cache (whole blocks of 16), and the
    log prices them by the first's prefill joules per computed token. With the engine's core in
    the caller's process and in its own (as on a GPU: the ledger crosses the pipe)."""
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from openjarvis.runtime.models import resolve_model
    from openjarvis.runtime.torch.engine import TorchEngine, TorchSettings

    settings = TorchSettings(device="cpu", max_seq_len=512, engine_process=engine_process)
    engine = TorchEngine(resolve_model(None).path, settings)
    system = {"role": "system", "content": "You answer questions about Python. " * 10}
    usages = []
    try:
        with (
            open_store(str(tmp_path / "ipw.db")) as store,
            running_server(engine, store) as server,
            httpx.Client(timeout=300) as client,
        ):
            for question in ("What is a list?", "What is a dict?"):
                body = {
                    "model": engine.model_name,
                    "messages": [system, {"role": "user", "content": question}],
                    "max_tokens": 2,
                }
                reply = client.post(f"{server.url}/chat/completions", json=body)
                assert reply.status_code == 200, reply.text
                usages.append(reply.json()["usage"])
            logged = request_logs(store)
    finally:
        engine.close()
    first, second = usages
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached % 16 == 0 and second["prompt_tokens"] - 16 - 8 < cached < second["prompt_tokens"]
    cold, warm = logged
    assert (cold.cached_tokens, warm.cached_tokens) == (0, cached)
    assert cold.prefill_energy_j is not None and cold.prefill_energy_j > 0
    price = cold.prefill_energy_j / cold.prompt_tokens  # it computed its whole prompt
    assert cold.prefill_saved_j == 0.0
    assert warm.prefill_saved_j == pytest.approx(cached * price)
