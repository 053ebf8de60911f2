"""`ipw measure --engine openai` against llama-cpp-python's own OpenAI-compatible server (a real
third-party server, started here on a free loopback port with the embedded GGUF): metered with
this machine's sources, tokens counted with the GGUF (that server streams no usage), and the
server that answered stored with the run."""

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import httpx
import pytest

from openjarvis.power.types import Method, weakest_method
from openjarvis.runtime.models import embedded_default
from openjarvis.store import open_store

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    gguf = embedded_default().path
    port = _free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048"]
    with open(log, "wb") as output:
        server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:  # start-up: the model loads before the port answers
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield url, gguf
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_measure_meters_llama_cpp_pythons_server_here(
    llama_server: tuple[str, Path], tmp_path: Path
) -> None:
    url, gguf = llama_server
    db = tmp_path / "runs.db"
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"), "OPENAI_API_KEY": "unused"}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "openjarvis", "measure", "--engine", "openai"),
            *("--base-url", url, "--model", str(gguf), "--limit", "2", "--idle-seconds", "1"),
            # Another measurement on a shared development machine would otherwise refuse it.
            *("--db", str(db), "--json", "--allow-shared"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    note = summary["energy_note"]
    assert "runs on this machine and was metered" in note
    assert "split each interval by time" in note
    assert f"no token usage with 2 replies, so their tokens were counted with {gguf}" in note
    with open_store(str(db)) as store:
        (run,) = store.list_runs()
        results = store.task_results(run.id or "")
    assert run.engine == "openai"
    server = run.engine_settings["server"]
    assert server == {"models": [str(gguf)], "header": "uvicorn"}  # llama_cpp.server's /v1/models
    assert run.engine_settings["meter"] == "local"
    assert len(results) == 2
    for result in results:
        sources = {reading.source for reading in result.energy}
        assert sources and not any(s.startswith("estimate:cloud") for s in sources)
        assert result.energy_j is not None and result.energy_j > 0
        assert result.prompt_tokens > 10 and result.completion_tokens > 0  # counted, never 0
    # The run's method is its local sources' (a counter, or the labelled CPU model where this
    # machine has none), not the cloud table's.
    methods = {reading.method for result in results for reading in result.energy}
    # The store keeps each reading's Method as its string.
    assert run.energy_method == weakest_method(cast("list[Method]", sorted(methods)))
