"""`jarvis serve` and `jarvis models` as a user runs them: a real process on 127.0.0.1."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from openjarvis.store import open_store, request_logs
from tests.signals import default_sigint

JARVIS = [sys.executable, "-c", "from openjarvis.cli.jarvis import main; main()"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_serve_answers_streams_logs_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    port, db = _free_port(), tmp_path / "ipw.db"
    env = {**os.environ, "OPENJARVIS_API_KEY": "k"}
    args = ["serve", "--port", str(port), "--idle-seconds", "0", "--db", str(db), "--n-ctx", "512"]
    server = subprocess.Popen(
        [*JARVIS, *args],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    try:
        deadline_s = time.monotonic() + 120
        while time.monotonic() < deadline_s:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.ConnectError:
                time.sleep(0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k")
        stream = client.chat.completions.create(
            model="gemma-3-270m-Q4_K_M",
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=8,
            stream=True,
        )
        chunks = list(stream)
        assert any(c.choices and c.choices[0].delta.content for c in chunks)
        assert "energy" in (chunks[-1].model_extra or {})
    finally:
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=60)
    assert server.returncode == 0, stderr
    assert f"at http://127.0.0.1:{port}/v1" in stderr and "stopped" in stderr
    # The embedded model is a base model: one line says so, once, at start.
    (warning,) = [line for line in stderr.splitlines() if "is a base model" in line]
    assert warning.startswith("note: gemma-3-270m-Q4_K_M is a base model (no chat template)")
    with open_store(str(db)) as store:
        (logged,) = request_logs(store)
    assert logged.stream and logged.completion_tokens > 0


def test_models_json_lists_the_embedded_model() -> None:
    done = subprocess.run(
        [*JARVIS, "models", "--json"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    (embedded,) = [m for m in json.loads(done.stdout)["models"] if m["origin"] == "embedded"]
    assert embedded["quantisation"] == "Q4_K_M" and embedded["parameters"] > 200_000_000
    assert embedded["kind"] == "base" and "no tokenizer.chat_template" in embedded["kind_evidence"]


def test_bad_engine_is_one_line_exit_2() -> None:
    done = subprocess.run(
        [*JARVIS, "serve", "--engine", "openai"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --engine openai needs --model NAME (the server's model name)"
    ]


def test_bad_max_concurrency_is_one_line_exit_2() -> None:
    done = subprocess.run(
        [*JARVIS, "serve", "--max-concurrency", "0"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --max-concurrency must be at least 1, not 0"
    ]


def test_port_in_use_is_one_line_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["serve", "--port", str(port), "--idle-seconds", "0", "--no-log", "--n-ctx", "512"]
        done = subprocess.run([*JARVIS, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: cannot listen on 127.0.0.1:{port} (Address already in use); pass another --port"
    ]
