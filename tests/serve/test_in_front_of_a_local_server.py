"""`jarvis serve --engine openai` in front of a server on this machine (a scripted one on
loopback, the network edge): its replies carry this machine's metered energy, not the table's."""

import json

import httpx

from openjarvis.runtime.cloud import CloudEngine, CloudSettings
from openjarvis.serve import running_server
from tests.runtime.stub_server import Reply, sse, stub_server


def test_replies_carry_this_machines_energy() -> None:
    events: list[dict[str, object]] = [
        {"choices": [{"index": 0, "text": "hello", "finish_reason": None}]},
        {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
    ]
    listing = json.dumps({"data": [{"id": "served"}]}).encode()
    with stub_server([sse(*events)], {"/v1/models": Reply(200, listing)}) as stub:
        engine = CloudEngine(CloudSettings("openai", "served", base_url=stub.url, max_retries=0))
        with running_server(engine) as server:
            body = {"model": "served", "prompt": "Say hi", "max_tokens": 4}
            reply = httpx.post(f"{server.url}/completions", json=body, timeout=30)
            coverage = server.meter.coverage
        engine.close()
    assert reply.status_code == 200, reply.text
    energy = reply.json()["energy"]
    sources = [source["source"] for source in energy["sources"]]
    assert sources and not any(name.startswith("estimate:cloud") for name in sources)
    assert set(sources) <= set(coverage.in_scope)  # the meter's own sources of this machine
